//! Properties over random command sequences: whatever is asked in whatever order, `decide`
//! and `evolve` never panic, terminal states never revert, the generation and `fail_count`
//! never fall, and every event reads back from its stored form.

use leasehold_domain::lease::{
    CloseCause, Lease, LeaseCommand as C, LeaseEvent, LeaseFacts, LeaseStatus, MaintenanceId,
    MaintenanceOutcome, OperationId, OperatorDetail, ReapCause, TerminalVerdict,
};
use leasehold_domain::{Aggregate, DomainEvent};
use proptest::prelude::*;
use uuid::Uuid;

use super::fixtures::{
    LEASE, MAINTENANCE, OPERATION, RESTORE_OPERATION, SOURCE, ctx_at, failed, hash, history, items,
    maintenance_failed, provisioned_on, provisioning, ready, recovered, report_failed_on, request,
    restarting, retained, retained_source, routed, t, updating,
};

const STEPS_MAX: usize = 24;

fn maintenance_id() -> impl Strategy<Value = MaintenanceId> {
    prop_oneof![Just(MAINTENANCE), Just(MaintenanceId(Uuid::from_u128(0x21)))]
}

/// The operations commands are started with, and one nothing started.
fn operation() -> impl Strategy<Value = OperationId> {
    prop_oneof![
        Just(OPERATION),
        Just(RESTORE_OPERATION),
        Just(OperationId::from(MAINTENANCE)),
        Just(OperationId(Uuid::from_u128(0x3f))),
    ]
}

fn outcome() -> impl Strategy<Value = MaintenanceOutcome> {
    prop_oneof![Just(MaintenanceOutcome::Succeeded), Just(recovered()), Just(maintenance_failed())]
}

fn command() -> impl Strategy<Value = C> {
    let minute = 0..u32::try_from(STEPS_MAX).expect("small");
    prop_oneof![
        Just(request()),
        operation().prop_map(provisioned_on),
        operation().prop_map(report_failed_on),
        operation().prop_map(|operation| C::ReportContainerDied {
            operation,
            detail: OperatorDetail::new("exit 137")
        }),
        maintenance_id().prop_map(|maintenance_id| C::Restart { maintenance_id }),
        (maintenance_id(), 1..4u8)
            .prop_map(|(maintenance_id, n)| C::Update { maintenance_id, payload_hash: hash(n) }),
        (maintenance_id(), minute, outcome()).prop_map(|(maintenance_id, m, outcome)| {
            C::CompleteMaintenance { maintenance_id, admitted_at: Some(t(m)), outcome }
        }),
        Just(C::Deprovision),
        any::<bool>().prop_map(|retained| C::ConfirmDeprovisioned { retained }),
        Just(C::Restore {
            lease: LEASE,
            from: SOURCE,
            provider: None,
            items: items(),
            operation: RESTORE_OPERATION
        }),
        Just(C::BeginRestore { into: SOURCE }),
        any::<bool>().prop_map(|committed| C::FinishRestore { into: SOURCE, committed }),
        Just(C::Reap { cause: ReapCause::GraceExpired }),
        Just(C::ConfirmReaped),
        Just(C::SetCustomDomain {
            service: Some(leasehold_domain::lease::ServiceName::parse("s", "web").expect("valid")),
            domain: Some(
                leasehold_domain::lease::HostName::parse("d", "a.example.com").expect("valid")
            ),
        }),
        (any::<bool>(), 0..3u32, any::<bool>()).prop_map(
            |(exhausted, consecutive_failures, complete_inventory)| {
                let verdict =
                    if exhausted { TerminalVerdict::Exhausted } else { TerminalVerdict::Available };
                C::ObserveTerminalBudget { verdict, consecutive_failures, complete_inventory }
            }
        ),
        Just(C::Close { cause: CloseCause::Tenant }),
        Just(C::Expire),
    ]
}

fn facts() -> impl Strategy<Value = LeaseFacts> {
    prop_oneof![
        Just(LeaseFacts::default()),
        Just(routed()),
        Just(retained_source(true, retained())),
        Just(LeaseFacts { retention_max_age: Some(chrono::TimeDelta::days(1)), ..routed() }),
    ]
}

/// What must hold from one state to the next.
fn check_step(before: &Lease, after: &Lease) {
    assert!(after.generation >= before.generation, "the generation fell");
    assert!(after.fail_count >= before.fail_count, "fail_count fell");
    if before.chain.is_terminal() {
        assert_eq!(after.chain, before.chain, "a terminal chain state changed");
    }
    if before.is_terminal() {
        assert_eq!(after, before, "a terminal lease changed");
    }
    if before.status == LeaseStatus::Deprovisioned {
        assert_eq!(after.status, LeaseStatus::Deprovisioned, "a released lease came back");
    }
    if before.status != LeaseStatus::None {
        assert_ne!(after.status, LeaseStatus::None, "a lease vanished");
    }
}

fn round_trips(event: &LeaseEvent) -> bool {
    LeaseEvent::from_stored(event.event_type(), &event.to_payload()).as_ref() == Ok(event)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_command_sequences_keep_the_invariants(
        start in 0..7usize,
        steps in prop::collection::vec((command(), facts()), 1..STEPS_MAX),
    ) {
        // Random sequences rarely create a lease on their own, so most start from a given.
        let given = [Vec::new(), provisioning(), ready(), failed(), restarting(), updating(), retained()];
        let mut log = history(&given[start]);
        let mut lease = Lease::replay(&log);
        for (minute, (command, facts)) in steps.into_iter().enumerate() {
            let ctx = ctx_at(u32::try_from(minute).expect("small"), facts);
            let Ok(events) = lease.decide(&command, &ctx) else { continue };
            for event in events {
                prop_assert!(round_trips(&event), "{event:?} does not read back");
                let after = lease.clone().evolve(&event);
                check_step(&lease, &after);
                lease = after;
                log.push(event);
            }
        }
        prop_assert_eq!(Lease::replay(&log), lease, "replaying the log gives another state");
    }
}
