//! Workload quotas (`commands/src/charges.rs`): every append that changes what a workload
//! holds carries its tenant's quota of that kind, so concurrent creations from separate
//! processes never take more than the limits allow; an end frees the room; a retry charges
//! once; one process's own concurrent creations take turns instead of exhausting retries.

use futures_util::future::join_all;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::quota::WorkloadQuotas;
use leasehold_commands::{
    CommandError, CommandPipeline, ErrorClass, PipelineConfig, workload_quota_of,
};
use leasehold_domain::lease::{LeaseCommand, LeaseFacts, LeaseId};
use leasehold_domain::workload_quota::{
    Limit, WorkloadKind, WorkloadQuota, WorkloadQuotaError, WorkloadQuotaEvent,
};
use leasehold_domain::{Actor, Aggregate, DomainEvent as _, EventStore as _, RefusalKind};
use leasehold_tests::TestDb;

use super::support::{Pipeline, new_lease, provision, request, routed, tenant};

fn operator() -> Caller {
    Caller {
        actor: Actor { subject: "ops".into(), role: "operator".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

/// A pipeline of its own, as another process's would be.
fn process(db: &TestDb) -> Pipeline {
    CommandPipeline::new(db.store(), PipelineConfig::default())
}

async fn set_lease_limits(db: &TestDb, key: &str, limits: &[(&str, u64)]) {
    let limits =
        limits.iter().map(|(resource, max)| Limit { resource: (*resource).into(), max: *max });
    let quotas = WorkloadQuotas::new(process(db));
    let set = (&tenant("acme"), WorkloadKind::Lease, limits.collect());
    quotas.set_limits(&operator(), key, set).await.expect("limits set");
}

/// acme's lease `lease` asked for under `key` (one GPU and two CPU units).
async fn ask(
    pipeline: &Pipeline,
    lease: LeaseId,
    key: &str,
) -> Result<leasehold_commands::CommandOutcome, CommandError<leasehold_domain::lease::LeaseError>> {
    pipeline.execute(request("acme", lease, key, provision(lease, 1), routed())).await
}

/// acme's lease quota at every version of its stream, oldest first.
async fn lease_quota_history(db: &TestDb) -> Vec<WorkloadQuota> {
    let stream = workload_quota_of(&tenant("acme"), WorkloadKind::Lease).stream_id();
    let events = db.store().read_stream(&stream, 1, 10_000).await.expect("readable");
    let mut quota = WorkloadQuota::initial();
    let mut history = Vec::new();
    for recorded in events {
        let event =
            WorkloadQuotaEvent::from_stored(recorded.event_type.as_str(), &recorded.payload)
                .expect("a quota event");
        quota = quota.evolve(&event);
        history.push(quota.clone());
    }
    history
}

fn count(quota: &WorkloadQuota) -> u64 {
    quota.usage.get("count").copied().unwrap_or(0)
}

#[tokio::test]
async fn eight_concurrent_lease_requests_with_room_for_three_commit_exactly_three() {
    let db = TestDb::migrated().await;
    set_lease_limits(&db, "limits", &[("count", 3)]).await;
    let processes: Vec<Pipeline> = (0..8).map(|_| process(&db)).collect();
    let leases: Vec<LeaseId> = (0..8).map(|_| new_lease()).collect();
    let outcomes = join_all(processes.iter().zip(&leases).map(|(pipeline, lease)| {
        let key = format!("ask-{}", lease.0.simple());
        async move { ask(pipeline, *lease, &key).await }
    }))
    .await;
    let committed = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    assert_eq!(committed, 3, "{outcomes:?}");
    for (outcome, lease) in outcomes.iter().zip(&leases) {
        let Err(refused) = outcome else { continue };
        assert!(
            matches!(refused, CommandError::LinkedRefused { kind: RefusalKind::QuotaExceeded, reason, .. }
                if reason == "lease quota exceeded: at most 3 of lease.count"),
            "{refused:?}"
        );
        assert_eq!(refused.class(), ErrorClass::QuotaExceeded);
        let stream = lease.stream_id();
        assert!(db.store().read_stream(&stream, 1, 10).await.expect("readable").is_empty());
    }
    let history = lease_quota_history(&db).await;
    assert!(history.iter().all(|quota| count(quota) <= 3), "{history:?}");
    let last = history.last().expect("reservations");
    assert_eq!(count(last), 3);
    assert_eq!(last.usage.get("sku.gpu.h100.1x"), Some(&3));
    assert_eq!(last.usage.get("sku.cpu.standard.4x"), Some(&6));
}

#[tokio::test]
async fn an_ended_lease_frees_its_room_and_a_retry_is_charged_once() {
    let db = TestDb::migrated().await;
    set_lease_limits(&db, "limits", &[("count", 5), ("sku.gpu.h100.1x", 1)]).await;
    let pipeline = process(&db);
    let first = new_lease();
    ask(&pipeline, first, "first").await.expect("room for one GPU");
    let retry = ask(&pipeline, first, "first").await.expect("a retry");
    assert!(retry.duplicate);
    let second = new_lease();
    let refused = ask(&pipeline, second, "second").await.expect_err("no GPU left");
    assert!(
        matches!(&refused, CommandError::LinkedRefused { reason, .. }
            if reason.contains("at most 1 of lease.sku.gpu.h100.1x")),
        "{refused:?}"
    );
    let history = lease_quota_history(&db).await;
    assert_eq!(history.len(), 2, "the limits, then one reservation: {history:?}");
    // A release asked for still holds the room (rule 9); its confirmation frees it, in the
    // same append.
    let deprovision =
        request("acme", first, "down", LeaseCommand::Deprovision, LeaseFacts::default());
    pipeline.execute(deprovision).await.expect("released");
    let still = ask(&pipeline, second, "second-while-releasing").await;
    assert_eq!(still.expect_err("still held").class(), ErrorClass::QuotaExceeded);
    let gone = LeaseCommand::ConfirmDeprovisioned { retained: false };
    pipeline
        .execute(request("acme", first, "gone", gone, LeaseFacts::default()))
        .await
        .expect("gone");
    let quota = lease_quota_history(&db).await.pop().expect("a quota");
    assert!(quota.usage.is_empty(), "{quota:?}");
    ask(&pipeline, second, "second-again").await.expect("room again");
    // Limits lowered below usage refuse more, and touch nothing held.
    set_lease_limits(&db, "lowered", &[("count", 1)]).await;
    let third = ask(&pipeline, new_lease(), "third").await.expect_err("at the count");
    assert_eq!(third.class(), ErrorClass::QuotaExceeded);
    let quota = WorkloadQuotas::new(process(&db))
        .quota(&tenant("acme"), WorkloadKind::Lease)
        .await
        .expect("readable")
        .expect("a quota");
    assert_eq!((count(&quota), quota.limits.get("count")), (1, Some(&1)));
}

#[tokio::test]
async fn one_process_concurrent_requests_take_turns_on_the_quota_stream() {
    let db = TestDb::migrated().await;
    let pipeline = process(&db);
    let leases: Vec<LeaseId> = (0..48).map(|_| new_lease()).collect();
    let outcomes = join_all(leases.iter().map(|lease| {
        let (pipeline, key) = (&pipeline, format!("ask-{}", lease.0.simple()));
        async move { ask(pipeline, *lease, &key).await }
    }))
    .await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let quota = lease_quota_history(&db).await.pop().expect("a quota");
    assert_eq!(count(&quota), 48);
    // Creations take turns on the quota stream: none of them lost a race to another.
    assert_eq!(pipeline.decided_again(), 0);
}

#[tokio::test]
async fn another_tenants_limits_never_touch_acmes_and_a_resource_no_lease_holds_is_refused() {
    let db = TestDb::migrated().await;
    let quotas = WorkloadQuotas::new(process(&db));
    let limits = vec![Limit { resource: "count".into(), max: 1 }];
    let globex = tenant("globex");
    quotas.set_limits(&operator(), "g", (&globex, WorkloadKind::Lease, limits)).await.expect("set");
    let pipeline = process(&db);
    for n in 0..3 {
        ask(&pipeline, new_lease(), &format!("a-{n}")).await.expect("acme has no limits");
    }
    let bad = vec![Limit { resource: "cpus".into(), max: 1 }];
    let refused = quotas.set_limits(&operator(), "bad", (&globex, WorkloadKind::Lease, bad)).await;
    assert!(
        matches!(&refused, Err(CommandError::Refused(WorkloadQuotaError::UnknownResource { .. }))),
        "{refused:?}"
    );
    let types: Vec<String> = {
        let stream = workload_quota_of(&globex, WorkloadKind::Lease).stream_id();
        let events = db.store().read_stream(&stream, 1, 100).await.expect("readable");
        events.iter().map(|event| event.event_type.to_string()).collect()
    };
    assert_eq!(types, ["WorkloadLimitsSet"], "the refused limits recorded nothing");
    let acme = lease_quota_history(&db).await.pop().expect("acme's own quota");
    assert_eq!((count(&acme), acme.limits.len()), (3, 0));
}
