//! The `run-dispatcher` reconciler over a real PostgreSQL: a run cancelled while its launch
//! was unanswered (no stop could be ordered then: one could overtake the launch it is to
//! stop) has its stop ordered once the node accepts the launch, without the tenant asking
//! again.

use std::sync::Arc;
use std::time::Duration;

use leasehold_adapters::PgProjectionStore;
use leasehold_adapters::rented::RunDispatcher;
use leasehold_commands::SystemClock;
use leasehold_domain::node::OperationResult;
use leasehold_domain::{Clock, StreamId};
use leasehold_projections::{ReconcilerConfig, ReconcilerRunner};
use leasehold_tests::TestDb;
use tokio::sync::watch;

use super::runs::launched;
use super::support::*;

const WAIT: Duration = Duration::from_secs(60);

async fn count(db: &TestDb, stream: &StreamId, event_type: &str) -> usize {
    events_of(db, stream).await.iter().filter(|e| e.event_type.as_str() == event_type).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_asked_before_the_launch_was_answered_orders_its_stop_once_accepted() {
    let db = TestDb::migrated().await;
    let clock = leasehold_projections::ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, _, enrolled) = launched(&services, &db).await;
    services.runs.cancel(&tenant("acme"), "cancel-1", run).await.expect("cancel recorded");
    assert_eq!(count(&db, &run.stream_id(), "RunStopOrdered").await, 0, "not while launching");
    let mut config = ReconcilerConfig::new(Arc::new(SystemClock) as Arc<dyn Clock>);
    config.retry_interval = Duration::from_millis(50);
    config.poll_interval = Duration::from_millis(50);
    let dispatcher = RunDispatcher::new(services.runs.clone());
    let runner = ReconcilerRunner::new(dispatcher, PgProjectionStore::new(db.store()), config);
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(runner.run(stopped));
    // The node accepts the launch: the stop the cancel asked for is ordered now.
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let attempt = stored.current().expect("an attempt").clone();
    let session = session_of(&services, &enrolled);
    let applied = (attempt.operation, OperationResult::Applied);
    services.nodes.settle(&session, "launch-applied", applied).await.expect("applied");
    let ordered = async {
        while count(&db, &run.stream_id(), "RunStopOrdered").await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, ordered).await.expect("the stop ordered in time");
    let node = events_of(&db, &node1(attempt.rental).stream_id()).await;
    let stops = node
        .iter()
        .filter(|e| e.event_type.as_str() == "NodeOperationRequested")
        .filter(|e| e.payload["order"].get("stop_workload").is_some())
        .count();
    assert_eq!(stops, 1, "one stop order on the node");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!(stored.stop.map(|stop| stop.fencing_token), Some(enrolled.fencing_token));
    stop.send_replace(true);
    let _ = tokio::time::timeout(WAIT, task).await;
}
