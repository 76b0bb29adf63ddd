//! The rentals read model through the real projection runner: what a tenant's rental row
//! holds (and never holds), its workloads row, and its quota usage, charged until the
//! termination is confirmed; a run's timeline row, and its usage, counted until it closes.

use leasehold_domain::rental::{CapacityState, Rental};
use leasehold_projections::ManualClock;
use leasehold_projections::node::NodeProjection;
use leasehold_projections::rental::RentalProjection;
use leasehold_projections::run::RunProjection;
use leasehold_tests::TestDb;

use super::support::*;
use crate::projections::support::{last_event, quick, start_of};

async fn usage(db: &TestDb, sku: &str) -> i64 {
    usage_of(db, "rental", sku).await
}

/// acme's usage of `sku` by workloads of `kind`, and how many of them are active.
async fn usage_of(db: &TestDb, kind: &str, sku: &str) -> i64 {
    let row = db
        .client()
        .await
        .query_opt(
            "SELECT quantity FROM quota_usage_skus WHERE tenant_id = 'acme' AND kind = $1 \
             AND sku = $2",
            &[&kind, &sku],
        )
        .await
        .expect("readable");
    row.map_or(0, |row| row.get(0))
}

async fn active_of(db: &TestDb, kind: &str) -> i64 {
    let row = db
        .client()
        .await
        .query_opt(
            "SELECT active_count FROM quota_usage WHERE tenant_id = 'acme' AND kind = $1",
            &[&kind],
        )
        .await
        .expect("readable");
    row.map_or(0, |row| row.get(0))
}

#[tokio::test]
async fn a_rental_row_shows_its_tenant_the_machine_and_nothing_of_its_secrets() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    super::runs::booked_run(&services, rental, "run-1").await;
    let mut running = start_of(RentalProjection, &db.store(), quick());
    running.reached(last_event(&db).await).await;
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT state, generation, observed_state, queued_runs, running_run IS NOT NULL, \
             interruptible_allocated, row_to_json(rentals)::text FROM rentals \
             WHERE rental_id = $1 AND tenant_id = 'acme'",
            &[&rental.0],
        )
        .await
        .expect("one row");
    assert_eq!(row.get::<_, &str>(0), "active");
    assert_eq!(row.get::<_, i64>(1), 1);
    assert_eq!(row.get::<_, Option<&str>>(2), Some("active"));
    assert_eq!((row.get::<_, i32>(3), row.get::<_, bool>(4)), (0, true));
    assert_eq!(row.get::<_, Option<bool>>(5), Some(false));
    let text: &str = row.get(6);
    let (_, _, state) = services
        .rentals
        .pipeline()
        .state::<Rental>(&rental.stream_id())
        .await
        .expect("read")
        .expect("exists");
    let ownership = state.ownership.expect("minted").0;
    for secret in [ownership.as_str(), "leasehold.test", "\"m-1\"", "1.0.0"] {
        assert!(!text.contains(secret), "{secret} in the rentals row: {text}");
    }
    let workload = client
        .query_one(
            "SELECT status, tenant_id FROM workloads WHERE kind = 'rental' AND workload_id = $1",
            &[&rental.0],
        )
        .await
        .expect("a workloads row");
    assert_eq!((workload.get::<_, &str>(0), workload.get::<_, &str>(1)), ("active", "acme"));
    assert_eq!(usage(&db, "rental.cpu_millis").await, 4_000);
    // A termination asked is still charged; the one confirmed is not.
    services.rentals.terminate(&tenant("acme"), "end", (rental, 1)).await.expect("asked");
    running.reached(last_event(&db).await).await;
    assert_eq!(usage(&db, "rental.gpus").await, 1, "still charged while terminating");
    let gone = looked(CapacityState::Terminated, start() + chrono::TimeDelta::seconds(60));
    services
        .rentals
        .observe(&provider(), "gone", &connection(), (rental, 1, gone))
        .await
        .expect("observed");
    running.reached(last_event(&db).await).await;
    assert_eq!(usage(&db, "rental.gpus").await, 0, "released once confirmed gone");
    assert_eq!(usage(&db, "rental.cpu_millis").await, 0);
    let state: String = client
        .query_one("SELECT state FROM rentals WHERE rental_id = $1", &[&rental.0])
        .await
        .expect("row")
        .get(0);
    assert_eq!(state, "terminated");
    running.stop().await;
}

#[tokio::test]
async fn a_node_row_shows_its_facts_and_their_receipt_and_no_token() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    let enrolled = enroll(&services, rental).await;
    let run = super::runs::booked_run(&services, rental, "run-1").await;
    let owner = leasehold_domain::TenantId::parse("acme").expect("valid");
    services.runs.dispatch(&provider(), &owner, run).await.expect("dispatched").expect("ready");
    let mut running = start_of(NodeProjection, &db.store(), quick());
    running.reached(last_event(&db).await).await;
    let row = db
        .client()
        .await
        .query_one(
            "SELECT state, generation, pending_operations, facts->>'os', facts_received_at, \
             rental_id, row_to_json(nodes)::text FROM nodes WHERE node_id = $1 \
             AND tenant_id = 'acme'",
            &[&node1(rental).0],
        )
        .await
        .expect("one row");
    assert_eq!(row.get::<_, &str>(0), "ready");
    assert_eq!((row.get::<_, i64>(1), row.get::<_, i32>(2)), (1, 1), "the launch is pending");
    assert_eq!(row.get::<_, Option<&str>>(3), Some("linux"));
    let received: Option<chrono::DateTime<chrono::Utc>> = row.get(4);
    assert_eq!(received, Some(start()), "received on Leasehold's clock, not the node's");
    assert_eq!(row.get::<_, uuid::Uuid>(5), rental.0);
    let text: &str = row.get(6);
    let token = key().enrollment_token(node1(rental));
    let hash: String = leasehold_commands::enrollment::token_hash(&token)
        .0
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    for secret in [token.as_str(), hash.as_str(), enrolled.credential.as_str()] {
        assert!(!text.contains(secret), "a token in the nodes row: {text}");
    }
    running.stop().await;
}

#[tokio::test]
async fn a_run_timeline_row_shows_attempts_outcome_and_receipt_and_no_token() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    let enrolled = enroll(&services, rental).await;
    let session = session_of(&services, &enrolled);
    let run = super::runs::booked_run(&services, rental, "run-1").await;
    let owner = leasehold_domain::TenantId::parse("acme").expect("valid");
    services.runs.dispatch(&provider(), &owner, run).await.expect("dispatched").expect("ready");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let attempt = stored.current().expect("attempt").clone();
    let applied = (attempt.operation, leasehold_domain::node::OperationResult::Applied);
    services.nodes.settle(&session, "launched", applied).await.expect("settled");
    let exited = leasehold_domain::run::WorkloadObservation {
        run,
        attempt: attempt.attempt,
        phase: leasehold_domain::run::WorkloadPhase::Exited,
        observed_at: start() + chrono::TimeDelta::hours(6),
        started_at: None,
        finished_at: None,
        exit_code: Some(2),
        oom_killed: false,
    };
    services.nodes.observe(&session, "exit", exited.clone()).await.expect("observed");
    let mut running = start_of(RunProjection, &db.store(), quick());
    running.reached(last_event(&db).await).await;
    let row = db
        .client()
        .await
        .query_one(
            "SELECT status, outcome, exit_code, cleanup, last_received_at, \
             jsonb_array_length(attempts), attempts->0->>'launch', rental_id, \
             row_to_json(run_timeline)::text FROM run_timeline \
             WHERE run_id = $1 AND tenant_id = 'acme'",
            &[&run.0],
        )
        .await
        .expect("one row");
    assert_eq!(row.get::<_, &str>(0), "finished");
    assert_eq!(row.get::<_, Option<&str>>(1), Some("failed"));
    assert_eq!(row.get::<_, Option<i32>>(2), Some(2));
    assert_eq!(row.get::<_, Option<&str>>(3), Some("pending"));
    let received: Option<chrono::DateTime<chrono::Utc>> = row.get(4);
    assert_eq!(received, Some(start()), "Leasehold's receipt, not the node's clock");
    assert_eq!(row.get::<_, i32>(5), 1);
    assert_eq!(row.get::<_, Option<&str>>(6), Some("accepted"));
    assert_eq!(row.get::<_, Option<uuid::Uuid>>(7), Some(rental.0));
    let text: &str = row.get(8);
    assert!(!text.contains(&attempt.operation.0.to_string()), "an operation id: {text}");
    assert!(!text.contains("fencing"), "{text}");
    let status: String = db
        .client()
        .await
        .query_one(
            "SELECT status FROM workloads WHERE kind = 'run' AND workload_id = $1",
            &[&run.0],
        )
        .await
        .expect("a workloads row")
        .get(0);
    assert_eq!(status, "finished");
    // Until it closes, the run counts in its tenant's usage with the runtime it may use.
    assert_eq!(active_of(&db, "run").await, 1);
    assert_eq!(usage_of(&db, "run", "run.max_runtime_seconds").await, 600);
    let absent = leasehold_domain::run::WorkloadObservation {
        phase: leasehold_domain::run::WorkloadPhase::Absent,
        exit_code: None,
        ..exited
    };
    services.nodes.observe(&session, "absent", absent).await.expect("observed");
    running.reached(last_event(&db).await).await;
    let closed: String = db
        .client()
        .await
        .query_one("SELECT status FROM run_timeline WHERE run_id = $1", &[&run.0])
        .await
        .expect("a row")
        .get(0);
    assert_eq!(closed, "closed");
    assert_eq!(active_of(&db, "run").await, 0, "a closed run counts no more");
    assert_eq!(usage_of(&db, "run", "run.max_runtime_seconds").await, 0);
    running.stop().await;
}

#[tokio::test]
async fn a_runs_read_says_whether_its_booking_runs_or_waits() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    let first = super::runs::booked_run(&services, rental, "run-1").await;
    let second = super::runs::booked_run(&services, rental, "run-2").await;
    let mut projections = [
        start_of(RunProjection, &db.store(), quick()),
        start_of(RentalProjection, &db.store(), quick()),
    ];
    for projection in &mut projections {
        projection.reached(last_event(&db).await).await;
    }
    let acme = leasehold_domain::TenantId::parse("acme").expect("valid");
    let scope = leasehold_adapters::read_models::Scope::Tenant(&acme);
    let read_models = leasehold_adapters::PgReadModels::of(&db.store());
    let listing = leasehold_adapters::read_models::RentedListing {
        rental: Some(rental.0),
        first: 10,
        ..Default::default()
    };
    let runs = read_models.runs(scope, &listing).await.expect("readable");
    let states: std::collections::BTreeMap<uuid::Uuid, Option<&str>> =
        runs.iter().map(|run| (run.run_id, run.booking_state.as_deref())).collect();
    let expected = [(second.0, Some("queued")), (first.0, Some("running"))];
    assert_eq!(states, expected.into_iter().collect());
    // Another tenant's scope reads none of them.
    let globex = leasehold_domain::TenantId::parse("globex").expect("valid");
    let theirs = leasehold_adapters::read_models::Scope::Tenant(&globex);
    assert!(read_models.runs(theirs, &listing).await.expect("readable").is_empty());
    for projection in projections {
        projection.stop().await;
    }
}
