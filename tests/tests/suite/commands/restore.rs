//! A restore and its source's retained record move together, in one transaction.

use leasehold_commands::ErrorClass;
use leasehold_domain::lease::{
    Lease, LeaseCommand, LeaseError, LeaseFacts, LeaseId, ReapCause, RetainedSource,
};
use leasehold_domain::{EventStore, TenantId};
use leasehold_tests::TestDb;

use super::support::*;

/// A retained lease of `tenant_name`.
async fn retained_lease(pipeline: &Pipeline, tenant_name: &str) -> LeaseId {
    let lease = ready_lease(pipeline, tenant_name).await;
    let plain =
        |key: &str, command| request(tenant_name, lease, key, command, LeaseFacts::default());
    pipeline.execute(plain("down", LeaseCommand::Deprovision)).await.expect("deprovisioning");
    let retained = LeaseCommand::ConfirmDeprovisioned { retained: true };
    pipeline.execute(plain("gone", retained)).await.expect("retained");
    lease
}

/// The facts a gateway looks up for a restore by `tenant_name` from `source`.
async fn source_facts(pipeline: &Pipeline, tenant_name: &str, source: LeaseId) -> LeaseFacts {
    let found = pipeline.state::<Lease>(&source.stream_id()).await.expect("readable");
    let retained_source = found.map(|(owner, _, lease)| RetainedSource {
        same_tenant: owner == TenantId::parse(tenant_name).expect("valid"),
        lease,
    });
    LeaseFacts { retained_source, ..LeaseFacts::default() }
}

fn restore(lease: LeaseId, from: LeaseId) -> LeaseCommand {
    let LeaseCommand::RequestProvision { items, .. } = provision(lease, 1) else { unreachable!() };
    LeaseCommand::Restore { lease, from, provider: None, items, operation: operation_of(lease) }
}

#[tokio::test]
async fn a_restore_moves_the_retained_record_with_it() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let source = retained_lease(&pipeline, "acme").await;
    let target = new_lease();
    let facts = source_facts(&pipeline, "acme", source).await;
    let started = pipeline
        .execute(request("acme", target, "restore", restore(target, source), facts))
        .await
        .expect("restoring");
    assert_eq!(started.event_types, ["LeaseRestoreStarted"]);
    let source_events = events_of(&db, source).await;
    let marked = source_events.last().expect("an event");
    assert_eq!(marked.event_type.as_str(), "LeaseRetentionRestoring");
    assert_eq!(Some(marked.cursor.tx_id), started.cursor.map(|c| c.tx_id), "one transaction");

    let done = request("acme", target, "up", provisioned(target), LeaseFacts::default());
    let provisioned = pipeline.execute(done).await.expect("provisioned");
    assert_eq!(provisioned.event_types, ["LeaseProvisioned", "LeaseActivated"]);
    assert_eq!(
        types_of(&db, source).await.last().map(String::as_str),
        Some("LeaseRetentionConsumed")
    );

    // The record is consumed: a second restore from it finds nothing.
    let again = new_lease();
    let facts = source_facts(&pipeline, "acme", source).await;
    let refused =
        pipeline.execute(request("acme", again, "restore-2", restore(again, source), facts)).await;
    assert_eq!(refused.expect_err("refused").class(), ErrorClass::NotFound);
    assert!(types_of(&db, again).await.is_empty());
}

#[tokio::test]
async fn a_source_that_stops_being_restorable_refuses_the_restore_whole() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let source = retained_lease(&pipeline, "acme").await;
    // The facts are looked up while the record is available...
    let facts = source_facts(&pipeline, "acme", source).await;
    // ...then another process starts reaping it.
    let reap = LeaseCommand::Reap { cause: ReapCause::GraceExpired };
    super::support::pipeline(&db)
        .execute(request("acme", source, "reap", reap, LeaseFacts::default()))
        .await
        .expect("reaping");
    let target = new_lease();
    let refused =
        pipeline.execute(request("acme", target, "restore", restore(target, source), facts)).await;
    let error = refused.expect_err("refused");
    assert!(
        matches!(
            error,
            leasehold_commands::CommandError::Refused(LeaseError::RetainedNotRestorable)
        ),
        "{error:?}"
    );
    assert!(types_of(&db, target).await.is_empty(), "nothing of the restore was written");
    assert_eq!(
        types_of(&db, source).await.last().map(String::as_str),
        Some("LeaseRetentionReaping")
    );
}

#[tokio::test]
async fn another_tenants_retained_lease_cannot_be_restored() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let source = retained_lease(&pipeline, "acme").await;
    let target = new_lease();
    let facts = source_facts(&pipeline, "globex", source).await;
    let refused = pipeline
        .execute(request("globex", target, "restore", restore(target, source), facts))
        .await;
    assert_eq!(refused.expect_err("refused").class(), ErrorClass::NotFound);
    // Even facts that wrongly claim the record is the tenant's do not get past the source's
    // own stream, which is another tenant's.
    let mut lying = source_facts(&pipeline, "acme", source).await;
    if let Some(retained) = lying.retained_source.as_mut() {
        retained.same_tenant = true;
    }
    let refused = pipeline
        .execute(request("globex", target, "restore-2", restore(target, source), lying))
        .await;
    assert_eq!(refused.expect_err("refused").class(), ErrorClass::NotFound);
    assert!(db.store().read_stream(&target.stream_id(), 1, 10).await.expect("readable").is_empty());
    assert_eq!(types_of(&db, source).await.last().map(String::as_str), Some("LeaseDeprovisioned"));
}

#[tokio::test]
async fn a_retried_restore_answers_exactly_the_first_calls_outcome_cursor_included() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let source = retained_lease(&pipeline, "acme").await;
    let target = new_lease();
    let facts = source_facts(&pipeline, "acme", source).await;
    let command = restore(target, source);
    let first = pipeline
        .execute(request("acme", target, "restore", command.clone(), facts.clone()))
        .await
        .expect("restoring");
    // The first call's cursor is its append's last event: after the source's mark, the
    // restored lease's reservation on its tenant's lease quota.
    let marked = events_of(&db, source).await.last().expect("an event").cursor;
    let quota = leasehold_commands::workload_quota_of(
        &super::support::tenant("acme"),
        leasehold_domain::workload_quota::WorkloadKind::Lease,
    );
    let quota = db.store().read_stream(&quota.stream_id(), 1, 100).await.expect("readable");
    let reserved = quota.last().expect("the restore's reservation");
    assert_eq!(reserved.event_type.as_str(), "WorkloadReserved");
    assert!(reserved.cursor > marked);
    assert_eq!(first.cursor, Some(reserved.cursor));
    // A retry from another process (nothing remembered) answers the same, cursor included,
    // so `minCursor` from it waits for the source's event too.
    let retried = super::support::pipeline(&db)
        .execute(request("acme", target, "restore", command, facts))
        .await
        .expect("a duplicate");
    assert!(retried.duplicate);
    assert_eq!((retried.stream_id, retried.version), (first.stream_id, first.version));
    assert_eq!(retried.cursor, first.cursor);
    assert_eq!(retried.event_types, first.event_types);
}
