//! The `rented-expiry` reconciler over a real PostgreSQL, on a controlled clock: a node that
//! stops beating is lost once its lease passed, never before (its runs stay as they were:
//! unobserved, not failed), and a rental past its max lifetime is terminated as such, once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::TimeDelta;
use leasehold_adapters::read_models::Scope;
use leasehold_adapters::rented::RentedExpiry;
use leasehold_adapters::{PgProjectionStore, PgReadModels};
use leasehold_domain::Clock;
use leasehold_domain::node::OperationResult;
use leasehold_projections::node::NodeProjection;
use leasehold_projections::rental::RentalProjection;
use leasehold_projections::run::RunProjection;
use leasehold_projections::{ManualClock, ReconcilerConfig, ReconcilerRunner, RunnerStats};
use leasehold_tests::TestDb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::runs::launched;
use super::support::*;
use crate::projections::support::{last_event, quick, start_of};
use crate::reaping::calls_past;

fn expiry(
    db: &TestDb,
    services: &Services,
    clock: &Arc<ManualClock>,
) -> (watch::Sender<bool>, JoinHandle<()>, Arc<RunnerStats>) {
    let reconciler = RentedExpiry::new(
        (services.nodes.clone(), services.rentals.clone()),
        PgReadModels::of(&db.store()),
        TimeDelta::seconds(10),
    );
    let mut config = ReconcilerConfig::new(Arc::clone(clock) as Arc<dyn Clock>);
    config.clock_moved = Some(clock.moved());
    config.retry_interval = Duration::from_millis(50);
    let runner = ReconcilerRunner::new(reconciler, PgProjectionStore::new(db.store()), config);
    let (stop, stopped) = watch::channel(false);
    let stats = runner.stats();
    (stop, tokio::spawn(runner.run(stopped)), stats)
}

async fn count(db: &TestDb, stream: &leasehold_domain::StreamId, event_type: &str) -> usize {
    events_of(db, stream).await.iter().filter(|e| e.event_type.as_str() == event_type).count()
}

async fn until(db: &TestDb, stream: &leasehold_domain::StreamId, event_type: &str) {
    eventually(event_type, || async { (count(db, stream, event_type).await > 0).then_some(()) })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_lost_after_its_lease_and_a_rental_ends_at_its_max_lifetime() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    // A run under way on the node: its launch ordered and applied.
    let (run, _, enrolled) = launched(&services, &db).await;
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let rental = stored.current().expect("an attempt").rental;
    let launch = stored.current().expect("an attempt").operation;
    let session = session_of(&services, &enrolled);
    let applied = (launch, OperationResult::Applied);
    services.nodes.settle(&session, "launch-applied", applied).await.expect("applied");
    let node = node1(rental).stream_id();
    let mut nodes = start_of(NodeProjection, &db.store(), quick());
    let mut rentals = start_of(RentalProjection, &db.store(), quick());
    let mut runs = start_of(RunProjection, &db.store(), quick());
    for projection in [&mut nodes, &mut rentals, &mut runs] {
        projection.reached(last_event(&db).await).await;
    }
    let (stop, task, stats) = expiry(&db, &services, &clock);
    calls_past(&stats, 0).await;
    // A minute without a beat: the 90 s lease has not passed, nothing is lost.
    let calls = stats.batches.load(Ordering::SeqCst);
    clock.advance(TimeDelta::seconds(60));
    calls_past(&stats, calls).await;
    assert_eq!(count(&db, &node, "NodeLost").await, 0);
    assert!(enrolled.lease_expires > clock.now());
    // Past the lease: lost, once.
    clock.advance(TimeDelta::seconds(40));
    until(&db, &node, "NodeLost").await;
    nodes.reached(last_event(&db).await).await;
    runs.reached(last_event(&db).await).await;
    // Its run is as it was, its node lost: unobserved, not failed.
    let acme = leasehold_domain::TenantId::parse("acme").expect("valid");
    let read = PgReadModels::of(&db.store()).run(Scope::Tenant(&acme), run.0).await;
    let read = read.expect("readable").expect("the run");
    assert_eq!((read.status.as_str(), read.outcome.as_deref()), ("running", None));
    assert_eq!(read.node_state.as_deref(), Some("lost"));
    assert!(read.unobserved(), "under way on a lost node: unobserved");
    let calls = stats.batches.load(Ordering::SeqCst);
    clock.advance(TimeDelta::seconds(20));
    calls_past(&stats, calls).await;
    assert_eq!(count(&db, &node, "NodeLost").await, 1);
    assert_eq!(count(&db, &rental.stream_id(), "CapacityTerminationRequested").await, 0);
    // A day after it was provisioned: its max lifetime (86 400 s) passed.
    clock.advance(TimeDelta::days(1));
    until(&db, &rental.stream_id(), "CapacityTerminationRequested").await;
    let ended = events_of(&db, &rental.stream_id()).await;
    let requested = ended
        .iter()
        .find(|e| e.event_type.as_str() == "CapacityTerminationRequested")
        .expect("requested");
    assert_eq!(requested.payload["cause"], "max_lifetime", "{}", requested.payload);
    rentals.reached(last_event(&db).await).await;
    let calls = stats.batches.load(Ordering::SeqCst);
    clock.advance(TimeDelta::seconds(20));
    calls_past(&stats, calls).await;
    assert_eq!(count(&db, &rental.stream_id(), "CapacityTerminationRequested").await, 1);
    stop.send_replace(true);
    let _ = tokio::time::timeout(WAIT, task).await;
    for projection in [nodes, rentals, runs] {
        projection.stop().await;
    }
}
