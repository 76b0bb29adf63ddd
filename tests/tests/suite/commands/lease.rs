//! Lease commands through the pipeline: fencing, state guards, tenants, validation,
//! snapshots.

use leasehold_commands::lease_input::{self, ItemInput, LeaseInputLimits};
use leasehold_commands::{CommandError, ErrorClass, PipelineConfig};
use leasehold_domain::lease::{
    Lease, LeaseCommand, LeaseError, LeaseEvent, LeaseFacts, LeaseStatus, MaintenanceId,
    MaintenanceOutcome,
};
use leasehold_domain::{Aggregate, DomainEvent};
use leasehold_tests::TestDb;
use uuid::Uuid;

use super::support::*;

/// The restart's admission stamp, as the event recorded it.
async fn admitted_at(
    db: &TestDb,
    lease: leasehold_domain::lease::LeaseId,
) -> chrono::DateTime<chrono::Utc> {
    let events = events_of(db, lease).await;
    let started = events
        .iter()
        .rev()
        .find(|e| e.event_type.as_str() == "LeaseRestartStarted")
        .expect("a restart");
    match LeaseEvent::from_stored(started.event_type.as_str(), &started.payload).expect("decodes") {
        LeaseEvent::LeaseRestartStarted { admitted_at, .. } => admitted_at,
        other => panic!("unexpected {other:?}"),
    }
}

fn complete(
    maintenance: MaintenanceId,
    admitted_at: chrono::DateTime<chrono::Utc>,
) -> LeaseCommand {
    LeaseCommand::CompleteMaintenance {
        maintenance_id: maintenance,
        admitted_at: Some(admitted_at),
        outcome: MaintenanceOutcome::Succeeded,
    }
}

#[tokio::test]
async fn a_completion_with_an_older_admission_stamp_is_fenced() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = ready_lease(&pipeline, "acme").await;
    let maintenance = MaintenanceId(Uuid::from_u128(42));
    let restart = LeaseCommand::Restart { maintenance_id: maintenance };
    pipeline
        .execute(request("acme", lease, "restart-1", restart.clone(), LeaseFacts::default()))
        .await
        .expect("restarting");
    let first_stamp = admitted_at(&db, lease).await;
    pipeline
        .execute(request(
            "acme",
            lease,
            "done-1",
            complete(maintenance, first_stamp),
            LeaseFacts::default(),
        ))
        .await
        .expect("settled");
    // The same maintenance id is reused for a second restart: a new admission stamp.
    pipeline
        .execute(request("acme", lease, "restart-2", restart, LeaseFacts::default()))
        .await
        .expect("restarting again");
    let before = types_of(&db, lease).await;
    let stale = pipeline
        .execute(request(
            "agent",
            lease,
            "done-stale",
            complete(maintenance, first_stamp),
            LeaseFacts::default(),
        ))
        .await;
    // The agent is another tenant here, so it must not even learn the lease exists.
    assert_eq!(stale.expect_err("refused").class(), ErrorClass::NotFound);
    let stale = pipeline
        .execute(request(
            "acme",
            lease,
            "done-stale",
            complete(maintenance, first_stamp),
            LeaseFacts::default(),
        ))
        .await;
    let error = stale.expect_err("fenced");
    assert!(matches!(error, CommandError::Refused(LeaseError::Fenced)), "{error:?}");
    assert_eq!(error.class(), ErrorClass::Fenced);
    assert_eq!(types_of(&db, lease).await, before, "no event");
    let current = admitted_at(&db, lease).await;
    assert!(current > first_stamp);
    pipeline
        .execute(request(
            "acme",
            lease,
            "done-2",
            complete(maintenance, current),
            LeaseFacts::default(),
        ))
        .await
        .expect("the current one settles");
}

#[tokio::test]
async fn a_second_restart_while_restarting_is_invalid_state() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = ready_lease(&pipeline, "acme").await;
    let restart = |n| LeaseCommand::Restart { maintenance_id: MaintenanceId(Uuid::from_u128(n)) };
    pipeline
        .execute(request("acme", lease, "restart-1", restart(1), LeaseFacts::default()))
        .await
        .expect("restarting");
    let before = types_of(&db, lease).await;
    let second = pipeline
        .execute(request("acme", lease, "restart-2", restart(2), LeaseFacts::default()))
        .await;
    let error = second.expect_err("refused");
    assert!(
        matches!(
            error,
            CommandError::Refused(LeaseError::InvalidState { status: LeaseStatus::Restarting, .. })
        ),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::InvalidState);
    assert_eq!(types_of(&db, lease).await, before);
}

#[tokio::test]
async fn another_tenants_lease_is_not_found() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = ready_lease(&pipeline, "acme").await;
    let before = types_of(&db, lease).await;
    // Both through this process's remembered state and through a fresh load.
    for pipeline in [pipeline.clone(), super::support::pipeline(&db)] {
        let outcome = pipeline
            .execute(request(
                "globex",
                lease,
                "down",
                LeaseCommand::Deprovision,
                LeaseFacts::default(),
            ))
            .await;
        assert!(matches!(outcome, Err(CommandError::NotFound)), "{outcome:?}");
        // Not even a create with the same id.
        let outcome =
            pipeline.execute(request("globex", lease, "take", provision(lease, 1), routed())).await;
        assert!(matches!(outcome, Err(CommandError::NotFound)), "{outcome:?}");
    }
    assert_eq!(types_of(&db, lease).await, before);
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_nothing_is_appended() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let limits = LeaseInputLimits { quantity_max: 4 };
    let item = |sku: &str, quantity| ItemInput { sku: sku.into(), quantity, service_name: None };
    for (items, field) in [
        (vec![], "items"),
        (vec![item("gpu.h100.1x", 0)], "items[0].quantity"),
        (vec![item("gpu.h100.1x", 5)], "items[0].quantity"),
        (vec![item("Not A SKU", 1)], "items[0].sku"),
    ] {
        assert_eq!(lease_input::items(&items, limits).expect_err("refused").field, field);
    }
    assert_eq!(
        lease_input::set_custom_domain(None, Some("exa mple")).expect_err("refused").field,
        "customDomain"
    );
    assert_eq!(lease_input::operation_key(None).expect_err("refused").field, "operationKey");
    // A SKU no backend serves is refused by the aggregate, and nothing is appended.
    let lease = new_lease();
    let outcome = pipeline
        .execute(request("acme", lease, "op", provision(lease, 1), LeaseFacts::default()))
        .await;
    assert_eq!(outcome.expect_err("refused").class(), ErrorClass::BadInput);
    assert!(types_of(&db, lease).await.is_empty());
}

#[tokio::test]
async fn an_expected_version_that_moved_is_a_concurrency_conflict() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = ready_lease(&pipeline, "acme").await;
    let mut command = request(
        "acme",
        lease,
        "restart",
        LeaseCommand::Restart { maintenance_id: MaintenanceId(Uuid::nil()) },
        LeaseFacts::default(),
    );
    command.expected_version = Some(1);
    let error = pipeline.execute(command.clone()).await.expect_err("refused");
    assert!(
        matches!(error, CommandError::ConcurrencyConflict { expected: 1, actual: 3 }),
        "{error:?}"
    );
    command.expected_version = Some(3);
    let outcome = pipeline.execute(command).await.expect("accepted");
    assert_eq!(outcome.version, 4);
}

#[tokio::test]
async fn aggregates_load_from_the_latest_snapshot_plus_the_tail() {
    let db = TestDb::migrated().await;
    let config = PipelineConfig { snapshot_every_events: 3, ..PipelineConfig::default() };
    let writer = pipeline_with(&db, config.clone());
    let lease = ready_lease(&writer, "acme").await;
    for n in 0..3u128 {
        let restart = LeaseCommand::Restart { maintenance_id: MaintenanceId(Uuid::from_u128(n)) };
        writer
            .execute(request("acme", lease, &format!("r{n}"), restart, LeaseFacts::default()))
            .await
            .expect("restarting");
        let stamp = events_of(&db, lease)
            .await
            .last()
            .map(|e| e.payload["admitted_at"].clone())
            .expect("an event");
        let stamp = serde_json::from_value(stamp).expect("a time");
        let done = complete(MaintenanceId(Uuid::from_u128(n)), stamp);
        writer
            .execute(request("acme", lease, &format!("d{n}"), done, LeaseFacts::default()))
            .await
            .expect("settled");
    }
    // 3 + 6 = 9 events: snapshots were written at 3, 6 and 9.
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT version FROM snapshots WHERE stream_id = $1",
            &[&lease.stream_id().as_str()],
        )
        .await
        .expect("a snapshot");
    assert_eq!(row.get::<_, i64>(0), 9);
    // Make the stream's early events unreadable: a reader that ignored the snapshot would fail.
    let replayed: Lease = {
        let events = events_of(&db, lease).await;
        Lease::replay(
            &events
                .iter()
                .map(|e| {
                    LeaseEvent::from_stored(e.event_type.as_str(), &e.payload).expect("decodes")
                })
                .collect::<Vec<_>>(),
        )
    };
    client
        .execute(
            "UPDATE events SET event_type = 'Unreadable' WHERE stream_id = $1 AND version <= 9",
            &[&lease.stream_id().as_str()],
        )
        .await
        .expect("updated");
    let reader = pipeline_with(&db, config);
    let outcome = reader
        .execute(request("acme", lease, "down", LeaseCommand::Deprovision, LeaseFacts::default()))
        .await
        .expect("loaded from the snapshot");
    // Nine events, then the release and its tenant's close.
    assert_eq!(outcome.version, 11);
    assert_eq!(replayed.status, LeaseStatus::Ready);
    assert_eq!(replayed.generation, 4);
}

#[tokio::test]
async fn a_snapshot_that_does_not_decode_is_ignored_and_the_state_rebuilt_from_events() {
    let db = TestDb::migrated().await;
    let lease = ready_lease(&pipeline(&db), "acme").await;
    // A snapshot of the current schema whose bytes this code cannot decode (a shape changed
    // without a schema bump).
    db.client()
        .await
        .execute(
            "INSERT INTO snapshots (stream_id, version, state_schema, state) VALUES ($1, 2, $2, $3)",
            &[&lease.stream_id().as_str(), &(Lease::STATE_SCHEMA as i32), &vec![0xffu8; 7]],
        )
        .await
        .expect("stored");
    // A process that remembers nothing loads the lease: from the events, and the stream stays
    // writable.
    let outcome = pipeline(&db)
        .execute(request("acme", lease, "down", LeaseCommand::Deprovision, LeaseFacts::default()))
        .await
        .expect("decided on the state rebuilt from the events");
    assert_eq!(outcome.event_types, ["LeaseDeprovisionRequested", "LeaseClosed"]);
}
