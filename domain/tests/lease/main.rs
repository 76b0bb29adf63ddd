//! The lease's transition table, row by row (the doc comment of `domain/src/lease.rs`), with
//! every guard's refusal; then properties over random command sequences.

mod fixtures;
mod properties;

use fixtures::*;
use leasehold_domain::lease::{
    ChainState, CloseCause, DispatchAnswer, Lease, LeaseCommand as C, LeaseError, LeaseFacts,
    LeaseItems, LeaseStatus, MaintenanceOutcome, OperatorDetail, ReapCause, RetentionStatus,
    TerminalVerdict,
};
use leasehold_domain::{Refusal, RefusalKind};

use Expect::{Events, NoChange, Refused};

fn none() -> LeaseFacts {
    LeaseFacts::default()
}

fn invalid(command: &'static str, status: LeaseStatus, chain: ChainState) -> Expect {
    Refused(LeaseError::InvalidState { command, status, chain })
}

#[test]
fn request_provision() {
    let lease = check(&[], request(), routed(), Events(&["LeaseProvisionRequested"]));
    assert_eq!(
        (lease.status, lease.chain, lease.generation),
        (LeaseStatus::Provisioning, ChainState::Pending, 1)
    );
    assert_eq!(lease.deploying_release, Some(1));
    check(
        &[],
        request(),
        none(),
        Refused(LeaseError::NoBackend { sku: items().as_slice()[0].sku.clone() }),
    );
    check(&provisioning(), request(), routed(), NoChange);
    let lease = check(&failed(), request(), routed(), Events(&["LeaseProvisionRequested"]));
    assert_eq!(
        (lease.status, lease.release_count, lease.generation),
        (LeaseStatus::Provisioning, 2, 2)
    );
    check(&failing(), request(), routed(), Events(&["LeaseProvisionRequested"]));
    check(
        &ready(),
        request(),
        routed(),
        invalid("RequestProvision", LeaseStatus::Ready, ChainState::Active),
    );
    check(
        &rejected(),
        request(),
        routed(),
        invalid("RequestProvision", LeaseStatus::Failed, ChainState::Rejected),
    );
    let other = C::RequestProvision {
        lease: LEASE,
        provider: OTHER_PROVIDER,
        items: items(),
        payload_hash: hash(1),
        operation: OPERATION,
    };
    check(&failed(), other, routed(), Refused(LeaseError::ProvisionMismatch));
    let other = C::RequestProvision {
        lease: LEASE,
        provider: PROVIDER,
        items: items(),
        payload_hash: hash(9),
        operation: OPERATION,
    };
    check(&failed(), other, routed(), Refused(LeaseError::ProvisionMismatch));
}

#[test]
fn commands_on_a_lease_that_does_not_exist_are_not_found() {
    for command in
        [provisioned(), C::Deprovision, C::Restart { maintenance_id: MAINTENANCE }, C::Expire]
    {
        check(&[], command, none(), Refused(LeaseError::NotFound));
    }
}

#[test]
fn report_provisioned() {
    let lease = check(
        &provisioning(),
        provisioned(),
        none(),
        Events(&["LeaseProvisioned", "LeaseActivated"]),
    );
    assert_eq!(
        (lease.status, lease.chain, lease.active_release),
        (LeaseStatus::Ready, ChainState::Active, Some(1))
    );
    check(&ready(), provisioned(), none(), NoChange);
    check(&deprovisioning(), provisioned(), none(), NoChange);
    check(&retained(), provisioned(), none(), NoChange);
    check(
        &failed(),
        provisioned(),
        none(),
        invalid("ReportProvisioned", LeaseStatus::Failed, ChainState::Active),
    );
    check(
        &restarting(),
        provisioned_on(MAINTENANCE.into()),
        none(),
        invalid("ReportProvisioned", LeaseStatus::Restarting, ChainState::Active),
    );
}

#[test]
fn report_failed_when_provisioning_rejects_a_pending_lease() {
    let lease = check(
        &provisioning(),
        report_failed(),
        none(),
        Events(&["LeaseProvisionFailed", "LeaseRejected"]),
    );
    assert_eq!(
        (lease.status, lease.chain, lease.fail_count),
        (LeaseStatus::Failed, ChainState::Rejected, 1)
    );
    assert_eq!(lease.reason.as_ref().map(|r| r.as_str()), Some("ImagePullFailed"));
    assert_eq!(lease.deploying_release, None);
}

#[test]
fn report_failed_on_a_running_lease() {
    let lease = check(&ready(), report_failed(), none(), Events(&["LeaseFailed"]));
    assert_eq!(
        (lease.status, lease.chain, lease.fail_count),
        (LeaseStatus::Failed, ChainState::Active, 1)
    );
    check(&failing(), report_failed(), none(), Events(&["LeaseFailed"]));
    check(&failed(), report_failed(), none(), NoChange);
    check(&deprovisioned(), report_failed(), none(), NoChange);
    check(
        &updating(),
        report_failed_on(MAINTENANCE.into()),
        none(),
        invalid("ReportFailed", LeaseStatus::Updating, ChainState::Active),
    );
}

#[test]
fn report_container_died() {
    let died =
        || C::ReportContainerDied { operation: OPERATION, detail: OperatorDetail::new("exit 1") };
    let lease = check(&ready(), died(), none(), Events(&["LeaseFailing"]));
    assert_eq!(lease.status, LeaseStatus::Failing);
    check(&failing(), died(), none(), NoChange);
    check(&failed(), died(), none(), NoChange);
    check(&deprovisioning(), died(), none(), NoChange);
    check(
        &provisioning(),
        died(),
        none(),
        invalid("ReportContainerDied", LeaseStatus::Provisioning, ChainState::Pending),
    );
}

#[test]
fn restart_and_update_start_a_fenced_maintenance() {
    let restart = || C::Restart { maintenance_id: MAINTENANCE };
    for given in [ready(), failing(), failed()] {
        let before: leasehold_domain::lease::Lease =
            leasehold_domain::Aggregate::replay(&history(&given));
        let lease = check(&given, restart(), none(), Events(&["LeaseRestartStarted"]));
        assert_eq!(lease.status, LeaseStatus::Restarting);
        assert_eq!(lease.pending.map(|p| (p.id, p.admitted_at)), Some((MAINTENANCE, t(30))));
        assert_eq!(lease.generation, before.generation + 1);
    }
    let update = || C::Update { maintenance_id: MAINTENANCE, payload_hash: hash(2) };
    let lease = check(&ready(), update(), none(), Events(&["LeaseUpdateStarted"]));
    assert_eq!(
        (lease.status, lease.deploying_release, lease.active_release),
        (LeaseStatus::Updating, Some(2), Some(1))
    );
    check(&failed(), update(), none(), Events(&["LeaseUpdateStarted"]));
}

#[test]
fn a_second_maintenance_while_one_is_pending_is_invalid_state() {
    let restart = || C::Restart { maintenance_id: MAINTENANCE };
    let update = || C::Update { maintenance_id: MAINTENANCE, payload_hash: hash(3) };
    check(
        &restarting(),
        restart(),
        none(),
        invalid("Restart", LeaseStatus::Restarting, ChainState::Active),
    );
    check(
        &restarting(),
        update(),
        none(),
        invalid("Update", LeaseStatus::Restarting, ChainState::Active),
    );
    check(
        &updating(),
        restart(),
        none(),
        invalid("Restart", LeaseStatus::Updating, ChainState::Active),
    );
    check(
        &provisioning(),
        restart(),
        none(),
        invalid("Restart", LeaseStatus::Provisioning, ChainState::Pending),
    );
    check(
        &deprovisioned(),
        update(),
        none(),
        invalid("Update", LeaseStatus::Deprovisioned, ChainState::Closed),
    );
    let mut closed_failed = closed();
    closed_failed.push((report_failed(), none()));
    check(
        &closed_failed,
        restart(),
        none(),
        invalid("Restart", LeaseStatus::Deprovisioning, ChainState::Closed),
    );
}

#[test]
fn completions_settle_only_the_matching_maintenance() {
    let lease = check(
        &restarting(),
        complete(2, MaintenanceOutcome::Succeeded),
        none(),
        Events(&["LeaseMaintenanceSucceeded"]),
    );
    assert_eq!((lease.status, lease.pending), (LeaseStatus::Ready, None));
    let lease = check(
        &restarting(),
        complete(2, recovered()),
        none(),
        Events(&["LeaseMaintenanceRecovered"]),
    );
    assert_eq!((lease.status, lease.fail_count), (LeaseStatus::Ready, 1));
    let lease = check(
        &restarting(),
        complete(2, maintenance_failed()),
        none(),
        Events(&["LeaseMaintenanceFailed"]),
    );
    assert_eq!((lease.status, lease.fail_count), (LeaseStatus::Failed, 1));
    // A reused maintenance id with an older admission stamp, and another id, are fenced.
    check(
        &restarting(),
        complete(1, MaintenanceOutcome::Succeeded),
        none(),
        Refused(LeaseError::Fenced),
    );
    let other = C::CompleteMaintenance {
        maintenance_id: leasehold_domain::lease::MaintenanceId(uuid::Uuid::from_u128(0x99)),
        admitted_at: Some(t(2)),
        outcome: MaintenanceOutcome::Succeeded,
    };
    check(&restarting(), other, none(), Refused(LeaseError::Fenced));
    // With nothing pending, only a repeat of the settled completion is accepted (as a no-op).
    check(
        &ready(),
        complete(2, MaintenanceOutcome::Succeeded),
        none(),
        Refused(LeaseError::Fenced),
    );
    let mut settled = restarting();
    settled.push((complete(2, MaintenanceOutcome::Succeeded), none()));
    check(&settled, complete(2, MaintenanceOutcome::Succeeded), none(), NoChange);
    // The same id reused by a newer restart: the old completion repeated is now stale.
    settled.push((C::Restart { maintenance_id: MAINTENANCE }, none()));
    check(
        &settled,
        complete(2, MaintenanceOutcome::Succeeded),
        none(),
        Refused(LeaseError::Fenced),
    );
    check(
        &settled,
        complete(4, MaintenanceOutcome::Succeeded),
        none(),
        Events(&["LeaseMaintenanceSucceeded"]),
    );
    // Late completions after a deprovision are ignored.
    let mut late = restarting();
    late.push((C::Deprovision, none()));
    check(&late, complete(2, MaintenanceOutcome::Succeeded), none(), NoChange);
}

#[test]
fn an_update_completion_moves_the_releases() {
    let lease = check(
        &updating(),
        complete(2, MaintenanceOutcome::Succeeded),
        none(),
        Events(&["LeaseMaintenanceSucceeded"]),
    );
    assert_eq!((lease.active_release, lease.deploying_release), (Some(2), None));
    let lease = check(
        &updating(),
        complete(2, recovered()),
        none(),
        Events(&["LeaseMaintenanceRecovered"]),
    );
    assert_eq!((lease.active_release, lease.deploying_release), (Some(1), None));
    let lease = check(
        &updating(),
        complete(2, maintenance_failed()),
        none(),
        Events(&["LeaseMaintenanceFailed"]),
    );
    assert_eq!((lease.status, lease.deploying_release), (LeaseStatus::Failed, None));
}

#[test]
fn deprovision_is_idempotent() {
    // A pending lease is rejected, an active one closed by its tenant (defect 7.7).
    let lease = check(
        &provisioning(),
        C::Deprovision,
        none(),
        Events(&["LeaseDeprovisionRequested", "LeaseRejected"]),
    );
    assert_eq!((lease.status, lease.pending), (LeaseStatus::Deprovisioning, None));
    for given in [ready(), failing(), failed(), restarting(), updating()] {
        let expected = Events(&["LeaseDeprovisionRequested", "LeaseClosed"]);
        let lease = check(&given, C::Deprovision, none(), expected);
        assert_eq!((lease.status, lease.pending), (LeaseStatus::Deprovisioning, None));
    }
    for given in [deprovisioning(), deprovisioned(), retained()] {
        check(&given, C::Deprovision, none(), NoChange);
    }
}

#[test]
fn confirm_deprovisioned() {
    let lease = check(
        &deprovisioning(),
        C::ConfirmDeprovisioned { retained: false },
        none(),
        Events(&["LeaseDeprovisioned"]),
    );
    assert_eq!(lease.status, LeaseStatus::Deprovisioned);
    let facts = LeaseFacts { retention_max_age: Some(chrono::TimeDelta::days(7)), ..none() };
    let lease = check(
        &deprovisioning(),
        C::ConfirmDeprovisioned { retained: true },
        facts,
        Events(&["LeaseDeprovisioned"]),
    );
    assert_eq!(lease.status, LeaseStatus::Retained);
    let retention = lease.retention.expect("retained");
    assert_eq!(retention.status, RetentionStatus::Active);
    assert_eq!(retention.retained_until, Some(t(0) + chrono::TimeDelta::days(7)));
    check(&deprovisioned(), C::ConfirmDeprovisioned { retained: false }, none(), NoChange);
    check(&retained(), C::ConfirmDeprovisioned { retained: true }, none(), NoChange);
    check(
        &ready(),
        C::ConfirmDeprovisioned { retained: true },
        none(),
        invalid("ConfirmDeprovisioned", LeaseStatus::Ready, ChainState::Active),
    );
}

fn restore_command(provider: Option<leasehold_domain::lease::ProviderId>, items: LeaseItems) -> C {
    C::Restore { lease: LEASE, from: SOURCE, provider, items, operation: RESTORE_OPERATION }
}

#[test]
fn restore_from_a_retained_lease() {
    let lease = check(
        &[],
        restore_command(Some(PROVIDER), items()),
        retained_source(true, retained()),
        Events(&["LeaseRestoreStarted"]),
    );
    assert_eq!((lease.status, lease.chain), (LeaseStatus::Restarting, ChainState::Pending));
    let terms = lease.terms.clone().expect("terms");
    assert_eq!((terms.restored_from, terms.backend.as_str()), (Some(SOURCE), "docker-1"));
    // Its completion is a provision report.
    let mut given = vec![(restore_command(None, items()), retained_source(true, retained()))];
    let provisioned = provisioned_on(RESTORE_OPERATION);
    check(&given, provisioned.clone(), none(), Events(&["LeaseProvisioned", "LeaseActivated"]));
    let failed = report_failed_on(RESTORE_OPERATION);
    check(&given, failed, none(), Events(&["LeaseProvisionFailed", "LeaseRejected"]));
    given.push((provisioned, none()));
    check(
        &given,
        restore_command(None, items()),
        retained_source(true, retained()),
        invalid("Restore", LeaseStatus::Ready, ChainState::Active),
    );
}

#[test]
fn restore_guards() {
    let restore = || restore_command(None, items());
    check(&[], restore(), none(), Refused(LeaseError::RetainedNotFound));
    check(
        &[],
        restore(),
        retained_source(false, retained()),
        Refused(LeaseError::RetainedNotFound),
    );
    check(
        &[],
        restore(),
        retained_source(true, deprovisioned()),
        Refused(LeaseError::RetainedNotFound),
    );
    check(&[], restore(), retained_source(true, ready()), Refused(LeaseError::RetainedNotFound));
    check(
        &[],
        restore(),
        retained_source(true, reaping()),
        Refused(LeaseError::RetainedNotRestorable),
    );
    check(
        &[],
        restore(),
        retained_source(true, source_restoring()),
        Refused(LeaseError::RetainedNotRestorable),
    );
    check(
        &[],
        restore_command(Some(OTHER_PROVIDER), items()),
        retained_source(true, retained()),
        Refused(LeaseError::ProviderMismatch),
    );
    let fewer =
        LeaseItems::new(vec![item("gpu.h100.1x", 1, "trainer"), item("cpu.standard.4x", 1, "web")])
            .expect("valid");
    check(
        &[],
        restore_command(None, fewer),
        retained_source(true, retained()),
        Refused(LeaseError::ItemShapeMismatch),
    );
    // Another tier of the same shape: a promote always fits, a demote only if the retained
    // data does, which only the backend can measure. It decides (422 demote_exceeds_tier).
    let demoted =
        LeaseItems::new(vec![item("gpu.a10.1x", 1, "trainer"), item("cpu.standard.4x", 2, "web")])
            .expect("valid");
    check(
        &[],
        restore_command(None, demoted),
        retained_source(true, retained()),
        Events(&["LeaseRestoreStarted"]),
    );
    let wrong_id = C::Restore {
        lease: LEASE,
        from: LEASE,
        provider: None,
        items: items(),
        operation: RESTORE_OPERATION,
    };
    check(&[], wrong_id, retained_source(true, retained()), Refused(LeaseError::RetainedNotFound));
}

#[test]
fn the_retained_record() {
    let lease = check(
        &retained(),
        C::BeginRestore { into: LEASE },
        none(),
        Events(&["LeaseRetentionRestoring"]),
    );
    assert_eq!(lease.retention.map(|r| r.status), Some(RetentionStatus::Restoring { into: LEASE }));
    check(
        &source_restoring(),
        C::BeginRestore { into: LEASE },
        none(),
        Refused(LeaseError::RetainedNotRestorable),
    );
    check(
        &reaping(),
        C::BeginRestore { into: LEASE },
        none(),
        Refused(LeaseError::RetainedNotRestorable),
    );
    check(
        &ready(),
        C::BeginRestore { into: LEASE },
        none(),
        Refused(LeaseError::RetainedNotRestorable),
    );

    let lease = check(
        &source_restoring(),
        C::FinishRestore { into: LEASE, committed: true },
        none(),
        Events(&["LeaseRetentionConsumed"]),
    );
    assert_eq!((lease.status, lease.retention), (LeaseStatus::Deprovisioned, None));
    let lease = check(
        &source_restoring(),
        C::FinishRestore { into: LEASE, committed: false },
        none(),
        Events(&["LeaseRetentionRestoreRolledBack"]),
    );
    assert_eq!(lease.retention.map(|r| r.status), Some(RetentionStatus::Active));
    check(
        &source_restoring(),
        C::FinishRestore { into: SOURCE, committed: true },
        none(),
        Refused(LeaseError::Fenced),
    );
    check(
        &retained(),
        C::FinishRestore { into: LEASE, committed: true },
        none(),
        Refused(LeaseError::Fenced),
    );

    let reap = || C::Reap { cause: ReapCause::TenantCapEvicted };
    let lease = check(&retained(), reap(), none(), Events(&["LeaseRetentionReaping"]));
    assert_eq!(lease.retention.map(|r| r.status), Some(RetentionStatus::Reaping));
    check(&reaping(), reap(), none(), NoChange);
    check(
        &source_restoring(),
        reap(),
        none(),
        invalid("Reap", LeaseStatus::Retained, ChainState::Closed),
    );
    let lease = check(&reaping(), C::ConfirmReaped, none(), Events(&["LeaseRetentionDeleted"]));
    assert_eq!((lease.status, lease.retention), (LeaseStatus::Deprovisioned, None));
    check(
        &retained(),
        C::ConfirmReaped,
        none(),
        invalid("ConfirmReaped", LeaseStatus::Retained, ChainState::Closed),
    );
}

#[test]
fn custom_domains() {
    let web = || Some(leasehold_domain::lease::ServiceName::parse("s", "web").expect("valid"));
    let domain =
        || Some(leasehold_domain::lease::HostName::parse("d", "app.example.com").expect("valid"));
    let set = || C::SetCustomDomain { service: web(), domain: domain() };
    let lease = check(&ready(), set(), none(), Events(&["LeaseCustomDomainSet"]));
    let terms = lease.terms.expect("terms");
    assert_eq!(terms.items.as_slice()[1].custom_domain, domain());
    assert_eq!(terms.items.as_slice()[0].custom_domain, None);
    let mut given = ready();
    given.push((set(), none()));
    check(&given, set(), none(), NoChange);
    check(
        &given,
        C::SetCustomDomain { service: web(), domain: None },
        none(),
        Events(&["LeaseCustomDomainSet"]),
    );
    check(&provisioning(), set(), none(), Events(&["LeaseCustomDomainSet"]));
    check(
        &ready(),
        C::SetCustomDomain { service: None, domain: domain() },
        none(),
        Refused(LeaseError::ItemNotFound { service: None }),
    );
    check(
        &deprovisioning(),
        set(),
        none(),
        invalid("SetCustomDomain", LeaseStatus::Deprovisioning, ChainState::Closed),
    );
    check(
        &closed(),
        set(),
        none(),
        invalid("SetCustomDomain", LeaseStatus::Deprovisioning, ChainState::Closed),
    );
}

fn observe(verdict: TerminalVerdict, consecutive_failures: u32, complete_inventory: bool) -> C {
    C::ObserveTerminalBudget { verdict, consecutive_failures, complete_inventory }
}

#[test]
fn the_terminal_failure_budget() {
    let lease = check(
        &failed(),
        observe(TerminalVerdict::Exhausted, 3, true),
        none(),
        Events(&[
            "LeaseTerminalBudgetObserved",
            "LeaseClosedForFailure",
            "LeaseDeprovisionRequested",
        ]),
    );
    assert_eq!(lease.chain, ChainState::Closed);
    // Never from a partial inventory, never with zero failures, never unless failed, and an
    // available budget only records.
    check(&failed(), observe(TerminalVerdict::Exhausted, 3, false), none(), NoChange);
    check(
        &failed(),
        observe(TerminalVerdict::Exhausted, 0, true),
        none(),
        Events(&["LeaseTerminalBudgetObserved"]),
    );
    check(
        &ready(),
        observe(TerminalVerdict::Exhausted, 3, true),
        none(),
        Events(&["LeaseTerminalBudgetObserved"]),
    );
    check(
        &failed(),
        observe(TerminalVerdict::Available, 3, true),
        none(),
        Events(&["LeaseTerminalBudgetObserved"]),
    );
    check(
        &rejected(),
        observe(TerminalVerdict::Exhausted, 3, true),
        none(),
        Events(&["LeaseTerminalBudgetObserved"]),
    );
    // The same observation again changes nothing; a gone lease ignores observations.
    let mut given = ready();
    given.push((observe(TerminalVerdict::Available, 1, true), none()));
    check(&given, observe(TerminalVerdict::Available, 1, true), none(), NoChange);
    check(&deprovisioned(), observe(TerminalVerdict::Exhausted, 3, true), none(), NoChange);
}

#[test]
fn a_high_fail_count_never_closes_a_lease() {
    let mut given = failed();
    for _ in 0..5 {
        given.push((request(), routed()));
        given.push((report_failed(), none()));
    }
    let lease =
        check(&given, C::Expire, none(), Events(&["LeaseExpired", "LeaseDeprovisionRequested"]));
    assert_eq!(lease.fail_count, 6);
    check(
        &given,
        observe(TerminalVerdict::Available, 6, true),
        none(),
        Events(&["LeaseTerminalBudgetObserved"]),
    );
}

#[test]
fn the_chain_state() {
    let close = |cause| C::Close { cause };
    let lease = check(
        &ready(),
        close(CloseCause::CreditDepleted),
        none(),
        Events(&["LeaseClosed", "LeaseDeprovisionRequested"]),
    );
    assert_eq!(lease.chain, ChainState::Closed);
    check(&closed(), close(CloseCause::Operator), none(), NoChange);
    check(
        &provisioning(),
        close(CloseCause::Tenant),
        none(),
        invalid("Close", LeaseStatus::Provisioning, ChainState::Pending),
    );
    check(
        &rejected(),
        close(CloseCause::Tenant),
        none(),
        invalid("Close", LeaseStatus::Failed, ChainState::Rejected),
    );
    let lease =
        check(&ready(), C::Expire, none(), Events(&["LeaseExpired", "LeaseDeprovisionRequested"]));
    assert_eq!(lease.chain, ChainState::Expired);
    let mut expired = ready();
    expired.push((C::Expire, none()));
    check(&expired, C::Expire, none(), NoChange);
    check(
        &expired,
        close(CloseCause::Tenant),
        none(),
        invalid("Close", LeaseStatus::Deprovisioning, ChainState::Expired),
    );
    check(
        &closed(),
        C::Expire,
        none(),
        invalid("Expire", LeaseStatus::Deprovisioning, ChainState::Closed),
    );
    check(
        &provisioning(),
        C::Expire,
        none(),
        invalid("Expire", LeaseStatus::Provisioning, ChainState::Pending),
    );
}

#[test]
fn refusals_say_what_they_mean_to_a_caller() {
    assert_eq!(LeaseError::Fenced.kind(), RefusalKind::Fenced);
    assert_eq!(LeaseError::NotFound.kind(), RefusalKind::NotFound);
    assert_eq!(LeaseError::RetainedNotFound.kind(), RefusalKind::NotFound);
    assert_eq!(LeaseError::ItemShapeMismatch.kind(), RefusalKind::Conflict);
    let invalid = LeaseError::InvalidState {
        command: "Restart",
        status: LeaseStatus::Restarting,
        chain: ChainState::Active,
    };
    assert_eq!(invalid.kind(), RefusalKind::InvalidState);
}

#[test]
fn events_round_trip_through_their_stored_form() {
    use leasehold_domain::DomainEvent;
    let mut given = updating();
    given.push((complete(2, recovered()), none()));
    given.push((C::Deprovision, none()));
    for event in history(&given) {
        let payload = event.to_payload();
        assert!(payload.get("type").is_none(), "the type is the envelope's, not the payload's");
        let back = leasehold_domain::lease::LeaseEvent::from_stored(event.event_type(), &payload)
            .expect("decodes");
        assert_eq!(back, event);
    }
    let error =
        leasehold_domain::lease::LeaseEvent::from_stored("LeaseVanished", &serde_json::json!({}))
            .expect_err("unknown type");
    assert_eq!(error.event_type, "LeaseVanished");
}

#[test]
fn a_restore_is_linked_to_its_source() {
    use leasehold_domain::Aggregate;
    let given = vec![(restore_command(None, items()), retained_source(true, retained()))];
    let restoring: leasehold_domain::lease::Lease = Aggregate::replay(&history(&given));
    let before = leasehold_domain::lease::Lease::initial();
    let started = history(&given);
    let linked = before.linked(&restore_command(None, items()), &started);
    assert_eq!(linked, vec![(SOURCE.stream_id(), C::BeginRestore { into: LEASE })]);
    let ctx = ctx_at(40, none());
    let report = provisioned_on(RESTORE_OPERATION);
    let events = restoring.decide(&report, &ctx).expect("accepted");
    let linked = restoring.linked(&report, &events);
    assert_eq!(
        linked,
        vec![(SOURCE.stream_id(), C::FinishRestore { into: LEASE, committed: true })]
    );
    let report = report_failed_on(RESTORE_OPERATION);
    let failed = restoring.decide(&report, &ctx).expect("accepted");
    let linked = restoring.linked(&report, &failed);
    assert_eq!(
        linked,
        vec![(SOURCE.stream_id(), C::FinishRestore { into: LEASE, committed: false })]
    );
    // A lease that was provisioned the ordinary way links nothing.
    let lease: leasehold_domain::lease::Lease = Aggregate::replay(&history(&provisioning()));
    let events = lease.decide(&provisioned(), &ctx).expect("accepted");
    assert!(lease.linked(&provisioned(), &events).is_empty());
}

/// Operation ids (the first row above the table): a report names the operation it settles.
/// A second provisioning cycle's identical report settles it, and a report of a superseded
/// operation is fenced wherever it arrives.
#[test]
fn reports_settle_only_the_current_operation() {
    let second = leasehold_domain::lease::OperationId(uuid::Uuid::from_u128(0x40));
    let retry = || match request() {
        C::RequestProvision { lease, provider, items, payload_hash, .. } => {
            C::RequestProvision { lease, provider, items, payload_hash, operation: second }
        }
        _ => unreachable!(),
    };
    let mut given = failed();
    given.push((retry(), routed()));
    let lease = check(&given, provisioned_on(second), none(), Events(&["LeaseProvisioned"]));
    assert_eq!((lease.status, lease.operation), (LeaseStatus::Ready, Some(second)));
    // The first cycle's reports arrive late: neither settles the second cycle.
    check(&given, provisioned(), none(), Refused(LeaseError::Fenced));
    check(&given, report_failed(), none(), Refused(LeaseError::Fenced));
    // Once the second cycle is ready, the first cycle's failure cannot fail it either, while the
    // second cycle's failure does, and its redelivery changes nothing.
    given.push((provisioned_on(second), none()));
    check(&given, report_failed(), none(), Refused(LeaseError::Fenced));
    let died = C::ReportContainerDied { operation: OPERATION, detail: OperatorDetail::new("x") };
    check(&given, died, none(), Refused(LeaseError::Fenced));
    check(&given, report_failed_on(second), none(), Events(&["LeaseFailed"]));
    given.push((report_failed_on(second), none()));
    check(&given, report_failed_on(second), none(), NoChange);
    // A restart's reports name its maintenance id; the provision's are superseded by it.
    let mut restarted = ready();
    restarted.push((C::Restart { maintenance_id: MAINTENANCE }, none()));
    let complete = complete(2, MaintenanceOutcome::Succeeded);
    restarted.push((complete, none()));
    check(&restarted, report_failed(), none(), Refused(LeaseError::Fenced));
    check(&restarted, report_failed_on(MAINTENANCE.into()), none(), Events(&["LeaseFailed"]));
    // A lease being released accepts its release confirmation whichever URL it came on, and
    // ignores late reports of any operation.
    restarted.push((C::Deprovision, none()));
    let confirm = C::ConfirmDeprovisioned { retained: false };
    check(&restarted, confirm, none(), Events(&["LeaseDeprovisioned"]));
    check(&restarted, report_failed(), none(), NoChange);
    check(&restarted, provisioned(), none(), NoChange);
    assert_eq!(LeaseError::Fenced.kind(), RefusalKind::Fenced);
}

#[test]
fn each_status_is_spelled_once_and_round_trips() {
    for status in LeaseStatus::ALL {
        assert_eq!(LeaseStatus::from_name(status.name()), Some(status));
        assert_eq!(serde_json::to_value(status).expect("serializes"), status.name());
    }
    for chain in ChainState::ALL {
        assert_eq!(ChainState::from_name(chain.name()), Some(chain));
        assert_eq!(serde_json::to_value(chain).expect("serializes"), chain.name());
    }
    assert_eq!(LeaseStatus::from_name("teleporting"), None);
}

#[test]
fn a_completion_echoing_its_admission_stamp_in_whole_seconds_settles_it() {
    use chrono::TimeDelta;
    use leasehold_domain::lease::{Lease, LeaseEvent};
    use leasehold_domain::{Aggregate, Context};
    // Backends echo `admitted_at` as RFC 3339 text, often in whole seconds. A stamp issued and
    // compared to the microsecond fenced such a backend's every completion for ever.
    let lease = history(&ready()).iter().fold(Lease::initial(), |lease, e| lease.evolve(e));
    let late_in_the_second = t(5) + TimeDelta::microseconds(123_456);
    let ctx = Context { now: late_in_the_second, ..ctx_at(5, none()) };
    let started = lease.decide(&C::Restart { maintenance_id: MAINTENANCE }, &ctx).unwrap();
    let [LeaseEvent::LeaseRestartStarted { admitted_at, .. }] = started.as_slice() else {
        panic!("{started:?}")
    };
    assert_eq!(*admitted_at, t(5), "the stamp is issued in whole seconds");
    let restarting = started.iter().fold(lease.clone(), |lease, e| lease.evolve(e));
    let settled =
        restarting.decide(&complete(5, MaintenanceOutcome::Succeeded), &ctx_at(6, none()));
    assert!(matches!(settled.as_deref(), Ok([LeaseEvent::LeaseMaintenanceSucceeded { .. }])));

    // A stamp stored to the microsecond before this rule (an older event) is still settled by
    // its whole-second echo, and by its exact echo: compared at whole seconds.
    let older = LeaseEvent::LeaseRestartStarted {
        maintenance_id: MAINTENANCE,
        admitted_at: late_in_the_second,
        generation: lease.generation + 1,
    };
    let restarting = lease.evolve(&older);
    for echo in [t(5), late_in_the_second] {
        let completion = C::CompleteMaintenance {
            maintenance_id: MAINTENANCE,
            admitted_at: Some(echo),
            outcome: MaintenanceOutcome::Succeeded,
        };
        let settled = restarting.decide(&completion, &ctx_at(6, none()));
        assert!(
            matches!(settled.as_deref(), Ok([LeaseEvent::LeaseMaintenanceSucceeded { .. }])),
            "{echo}"
        );
    }
    // Another second is another stamp: fenced.
    let stale = restarting.decide(&complete(4, MaintenanceOutcome::Succeeded), &ctx_at(6, none()));
    assert_eq!(stale, Err(LeaseError::Fenced));
}

#[test]
fn a_maintenance_id_reused_within_its_second_gets_a_later_stamp() {
    use leasehold_domain::Aggregate;
    use leasehold_domain::lease::{Lease, LeaseEvent};
    // Stamps are whole seconds, so a restart reusing the id of one settled in the same
    // second would share its stamp, and the old completion repeated would settle it.
    let mut given = restarting();
    given.push((complete(2, MaintenanceOutcome::Succeeded), none()));
    let lease = history(&given).iter().fold(Lease::initial(), |lease, e| lease.evolve(e));
    let again =
        lease.decide(&C::Restart { maintenance_id: MAINTENANCE }, &ctx_at(2, none())).unwrap();
    let [LeaseEvent::LeaseRestartStarted { admitted_at, .. }] = again.as_slice() else {
        panic!("{again:?}")
    };
    assert_eq!(*admitted_at, t(2) + chrono::TimeDelta::seconds(1));
    let restarting = again.iter().fold(lease, |lease, e| lease.evolve(e));
    let old = restarting.decide(&complete(2, MaintenanceOutcome::Succeeded), &ctx_at(3, none()));
    assert_eq!(old, Err(LeaseError::Fenced));

    // Ids reused in turn within one second (M, then another, then M again): stamps still
    // only increase, so M's first completion repeated late settles nothing.
    let other = leasehold_domain::lease::MaintenanceId(uuid::Uuid::from_u128(0x77));
    let mut lease = restarting;
    let mut stamps = Vec::new();
    for id in [other, MAINTENANCE] {
        let settle = |lease: &Lease, stamp| C::CompleteMaintenance {
            maintenance_id: lease.pending.map_or(id, |p| p.id),
            admitted_at: Some(stamp),
            outcome: MaintenanceOutcome::Succeeded,
        };
        let pending = lease.pending.expect("a pending maintenance");
        let done = lease.decide(&settle(&lease, pending.admitted_at), &ctx_at(2, none())).unwrap();
        lease = done.iter().fold(lease, |lease, e| lease.evolve(e));
        let started = lease.decide(&C::Restart { maintenance_id: id }, &ctx_at(2, none())).unwrap();
        lease = started.iter().fold(lease, |lease, e| lease.evolve(e));
        stamps.push(lease.pending.expect("restarting").admitted_at);
    }
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
    let late = lease.decide(&complete(2, MaintenanceOutcome::Succeeded), &ctx_at(3, none()));
    assert_eq!(late, Err(LeaseError::Fenced));
}

#[test]
fn a_provision_request_contradicting_the_recorded_terms_while_provisioning_is_a_conflict() {
    use leasehold_domain::lease::ProviderId;
    // The same request again is a no-op; another provider, other items or another manifest
    // for the same lease is a contradiction, refused (it was silently accepted).
    check(&provisioning(), request(), routed(), NoChange);
    let contradictions = [
        C::RequestProvision {
            lease: LEASE,
            provider: ProviderId(uuid::Uuid::from_u128(0x99)),
            items: items(),
            payload_hash: hash(1),
            operation: OPERATION,
        },
        C::RequestProvision {
            lease: LEASE,
            provider: PROVIDER,
            items: LeaseItems::new(vec![item("gpu.h100.1x", 3, "trainer")]).unwrap(),
            payload_hash: hash(1),
            operation: OPERATION,
        },
        C::RequestProvision {
            lease: LEASE,
            provider: PROVIDER,
            items: items(),
            payload_hash: hash(2),
            operation: OPERATION,
        },
    ];
    for contradiction in contradictions {
        let refused = Refused(LeaseError::ProvisionMismatch);
        check(&provisioning(), contradiction, routed(), refused);
    }
    assert_eq!(LeaseError::ProvisionMismatch.kind(), RefusalKind::Conflict);
}

fn dispatch(generation: u64, answer: DispatchAnswer) -> C {
    C::RecordDispatch { generation, attempt: 1, answer }
}

fn refused() -> DispatchAnswer {
    let (reason, message, detail) = failure();
    DispatchAnswer::Refused { reason, message, detail }
}

fn no_answer() -> DispatchAnswer {
    DispatchAnswer::Failed { detail: OperatorDetail::new("connection refused") }
}

#[test]
fn record_dispatch() {
    // Accepted and unanswered attempts are recorded and change no status.
    let lease = check(
        &provisioning(),
        dispatch(1, DispatchAnswer::Accepted),
        none(),
        Events(&["LeaseDispatched"]),
    );
    assert_eq!(lease.status, LeaseStatus::Provisioning);
    let lease =
        check(&provisioning(), dispatch(1, no_answer()), none(), Events(&["LeaseDispatchFailed"]));
    assert_eq!(lease.status, LeaseStatus::Provisioning);
    let lease = check(
        &deprovisioning(),
        dispatch(2, DispatchAnswer::Accepted),
        none(),
        Events(&["LeaseDispatched"]),
    );
    assert_eq!(lease.status, LeaseStatus::Deprovisioning);
    // A refused provision fails the lease, and rejects it while pending.
    let lease = check(
        &provisioning(),
        dispatch(1, refused()),
        none(),
        Events(&["LeaseProvisionFailed", "LeaseRejected"]),
    );
    assert_eq!((lease.status, lease.chain), (LeaseStatus::Failed, ChainState::Rejected));
    // A refused restart or update settles the maintenance as failed.
    let lease =
        check(&restarting(), dispatch(2, refused()), none(), Events(&["LeaseMaintenanceFailed"]));
    assert_eq!((lease.status, lease.pending), (LeaseStatus::Failed, None));
    check(&updating(), dispatch(2, refused()), none(), Events(&["LeaseMaintenanceFailed"]));
    // An answer about older work changes nothing: the lease has moved on.
    check(&ready(), dispatch(0, refused()), none(), NoChange);
    check(&restarting(), dispatch(1, refused()), none(), NoChange);
    check(&deprovisioning(), dispatch(1, DispatchAnswer::Accepted), none(), NoChange);
    // A refusal of work already settled (the callback came first) changes nothing.
    check(&ready(), dispatch(1, refused()), none(), NoChange);
    check(&deprovisioning(), dispatch(2, refused()), none(), NoChange);
    check(&[], dispatch(1, DispatchAnswer::Accepted), none(), Refused(LeaseError::NotFound));
}

#[test]
fn a_refused_restore_rolls_its_source_back() {
    use leasehold_domain::Aggregate;
    let given = vec![(restore_command(None, items()), retained_source(true, retained()))];
    let before = Lease::replay(&history(&given));
    let command = dispatch(before.generation, refused());
    let events = before.decide(&command, &ctx_at(30, none())).expect("decided");
    let linked = before.linked(&command, &events);
    assert_eq!(
        linked,
        vec![(SOURCE.stream_id(), C::FinishRestore { into: LEASE, committed: false })]
    );
    let accepted = dispatch(before.generation, DispatchAnswer::Accepted);
    let events = before.decide(&accepted, &ctx_at(30, none())).expect("decided");
    assert!(before.linked(&accepted, &events).is_empty());
}

/// Defect 7.4: a backend that predates admission stamps echoes none; its completion settles
/// the pending maintenance by the id alone, repeats as a no-op, and never settles another.
#[test]
fn an_unstamped_completion_settles_by_the_maintenance_id() {
    let unstamped = |id| C::CompleteMaintenance {
        maintenance_id: id,
        admitted_at: None,
        outcome: MaintenanceOutcome::Succeeded,
    };
    let lease = check(
        &restarting(),
        unstamped(MAINTENANCE),
        none(),
        Events(&["LeaseMaintenanceSucceeded"]),
    );
    assert_eq!((lease.status, lease.pending), (LeaseStatus::Ready, None));
    let mut settled = restarting();
    settled.push((unstamped(MAINTENANCE), none()));
    check(&settled, unstamped(MAINTENANCE), none(), NoChange);
    let other = leasehold_domain::lease::MaintenanceId(uuid::Uuid::from_u128(0x99));
    check(&restarting(), unstamped(other), none(), Refused(LeaseError::Fenced));
    check(&updating(), unstamped(MAINTENANCE), none(), Events(&["LeaseMaintenanceSucceeded"]));
}

/// Defect 7.7: a lease its tenant releases ends on the chain too (closed by the tenant, or
/// rejected while never acknowledged); one released before this rule is closed when asked again.
#[test]
fn a_tenant_release_ends_the_lease_on_the_chain() {
    use leasehold_domain::Aggregate;
    use leasehold_domain::lease::LeaseEvent;
    let lease = check(
        &ready(),
        C::Deprovision,
        none(),
        Events(&["LeaseDeprovisionRequested", "LeaseClosed"]),
    );
    assert_eq!((lease.status, lease.chain), (LeaseStatus::Deprovisioning, ChainState::Closed));
    let lease = check(
        &provisioning(),
        C::Deprovision,
        none(),
        Events(&["LeaseDeprovisionRequested", "LeaseRejected"]),
    );
    assert_eq!(lease.chain, ChainState::Rejected);
    // Released (the old way) with the chain still active: asking again closes it.
    let stranded = vec![LeaseEvent::LeaseDeprovisionRequested { generation: 2, at: t(3) }];
    let before = Lease::replay(&[history(&ready()), stranded].concat());
    assert_eq!((before.status, before.chain), (LeaseStatus::Deprovisioning, ChainState::Active));
    let events = before.decide(&C::Deprovision, &ctx_at(30, none())).expect("decided");
    let types: Vec<&str> = events.iter().map(leasehold_domain::DomainEvent::event_type).collect();
    assert_eq!(types, ["LeaseClosed"]);
    check(&deprovisioned(), C::Deprovision, none(), NoChange);
}

/// Defect 7.6: closing a lease releases what its backend holds.
#[test]
fn closing_a_lease_releases_it() {
    let lease = check(
        &ready(),
        C::Close { cause: CloseCause::Operator },
        none(),
        Events(&["LeaseClosed", "LeaseDeprovisionRequested"]),
    );
    assert_eq!((lease.status, lease.chain), (LeaseStatus::Deprovisioning, ChainState::Closed));
    check(
        &failed(),
        C::Close { cause: CloseCause::CreditDepleted },
        none(),
        Events(&["LeaseClosed", "LeaseDeprovisionRequested"]),
    );
    // Closed and released already: nothing more.
    let mut closed = ready();
    closed.push((C::Close { cause: CloseCause::Tenant }, none()));
    check(&closed, C::Close { cause: CloseCause::Tenant }, none(), NoChange);
}

/// Defect 7.1: a lease released while it is being restored gives its source's retained record
/// back (the restore never completed), in the same transaction, instead of stranding it in
/// `restoring`.
#[test]
fn releasing_a_restoring_lease_rolls_its_source_back() {
    use leasehold_domain::Aggregate;
    let given = vec![(restore_command(None, items()), retained_source(true, retained()))];
    let restoring = Lease::replay(&history(&given));
    // (A restored lease is pending until its restore completes: only a release applies.)
    let events = restoring.decide(&C::Deprovision, &ctx_at(30, none())).expect("decided");
    assert_eq!(
        restoring.linked(&C::Deprovision, &events),
        vec![(SOURCE.stream_id(), C::FinishRestore { into: LEASE, committed: false })],
    );
}

/// Review: every way a live lease's chain ends releases what its backend holds (expiry and
/// closure for failure too, not only Close), and a lease released before these rules whose
/// chain was left pending is rejected when asked again.
#[test]
fn every_end_of_the_chain_releases_the_lease() {
    use leasehold_domain::Aggregate;
    use leasehold_domain::lease::LeaseEvent;
    let lease =
        check(&ready(), C::Expire, none(), Events(&["LeaseExpired", "LeaseDeprovisionRequested"]));
    assert_eq!((lease.status, lease.chain), (LeaseStatus::Deprovisioning, ChainState::Expired));
    let stranded = vec![LeaseEvent::LeaseDeprovisionRequested { generation: 2, at: t(3) }];
    let before = Lease::replay(&[history(&provisioning()), stranded].concat());
    assert_eq!(before.chain, ChainState::Pending);
    let events = before.decide(&C::Deprovision, &ctx_at(30, none())).expect("decided");
    let types: Vec<&str> = events.iter().map(leasehold_domain::DomainEvent::event_type).collect();
    assert_eq!(types, ["LeaseRejected"]);
}
