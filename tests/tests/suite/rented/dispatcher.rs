//! The `run-dispatcher` reconciler over a real PostgreSQL: a run cancelled while its launch
//! was unanswered (no stop could be ordered then: one could overtake the launch it is to
//! stop) has its stop ordered once the node accepts the launch, without the tenant asking
//! again; a run whose machine was stopped and resumed (or terminated) under it ends with its
//! node, the next booking runs on the new generation's node, and a run still waiting on a
//! terminated rental fails as `RentalTerminated`; and a run queued on a rental has its image
//! prepared on the node ahead of its launch, once, unless the node holds it hot.

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

use leasehold_commands::enrollment::node_of;
use leasehold_commands::node_service::Presented;
use leasehold_commands::run_service::SubmitRun;
use leasehold_domain::node::{ImageFact, Locality, ManifestDigest, NodeId, NodeOrder};
use leasehold_domain::rental::{CapacityState, RentalId};
use leasehold_domain::run::{Cleanup, Outcome, Run, RunId, RunStatus};

use super::runs::{booked_run, launched};
use super::support::*;

async fn count(db: &TestDb, stream: &StreamId, event_type: &str) -> usize {
    events_of(db, stream).await.iter().filter(|e| e.event_type.as_str() == event_type).count()
}

/// The run dispatcher running over `db` until the sender is told to stop.
fn dispatching(
    services: &Services,
    db: &TestDb,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let mut config = ReconcilerConfig::new(Arc::new(SystemClock) as Arc<dyn Clock>);
    config.retry_interval = Duration::from_millis(50);
    config.poll_interval = Duration::from_millis(50);
    let dispatcher = RunDispatcher::new((services.runs.clone(), services.nodes.clone()));
    let runner = ReconcilerRunner::new(dispatcher, PgProjectionStore::new(db.store()), config);
    let (stop, stopped) = watch::channel(false);
    (stop, tokio::spawn(runner.run(stopped)))
}

/// Waits (bounded) until `run` as stored satisfies `done`.
async fn run_until(
    services: &Services,
    run: RunId,
    what: &str,
    done: impl Fn(&Run) -> bool,
) -> Run {
    eventually(what, || async {
        let (_, stored) = services.runs.owned(run).await.expect("read");
        done(&stored).then_some(stored)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_with_its_node_and_a_waiting_one_with_its_terminated_rental() {
    let db = TestDb::migrated().await;
    let clock = leasehold_projections::ManualClock::at(start());
    let services = services(&db, &clock);
    let (first, attempt, enrolled) = launched(&services, &db).await;
    let (_, stored) = services.runs.owned(first).await.expect("read");
    let rental = stored.booking.expect("booked").rental;
    let session = session_of(&services, &enrolled);
    let operation = stored.current().expect("an attempt").operation;
    services
        .nodes
        .settle(&session, "applied", (operation, OperationResult::Applied))
        .await
        .expect("applied");
    let second = booked_run(&services, rental, "run-2").await;
    let (stop, task) = dispatching(&services, &db);
    // The tenant stops the machine under the running run, and resumes it: generation 1's
    // node is retired, and the run with it.
    let (acme, at) = (tenant("acme"), |s| start() + chrono::TimeDelta::seconds(s));
    let observe = |key: &'static str, generation, state, s| {
        let look = looked(state, at(s));
        let rentals = &services.rentals;
        async move {
            rentals
                .observe(&provider(), key, &connection(), (rental, generation, look))
                .await
                .expect("observed");
        }
    };
    services.rentals.stop(&acme, "stop", (rental, 1)).await.expect("stopped");
    observe("seen-stopped", 1, CapacityState::Stopped, 5).await;
    services.rentals.resume(&acme, "resume", (rental, 1)).await.expect("resumed");
    let ended =
        run_until(&services, first, "the first run ended", |run| run.status == RunStatus::Closed)
            .await;
    assert_eq!(ended.outcome, Some(Outcome::Failed));
    assert_eq!(ended.failure.as_ref().map(|reason| reason.as_str()), Some("NodeRetired"));
    assert_eq!(ended.cleanup, Some(Cleanup::Confirmed), "the machine's stop ended it");
    assert_eq!(ended.current().map(|a| a.attempt), Some(attempt));
    // The second booking runs now, and is launched on generation 2's node once it enrolls.
    observe("seen-active", 2, CapacityState::Active, 60).await;
    let node2 = node_of(rental, 2);
    let token = key().enrollment_token(node2);
    let presented = Presented::Token { token: &token, rental, generation: 2 };
    services.nodes.enroll(node2, presented, (agent_version(), facts())).await.expect("enrolled");
    let launching =
        run_until(&services, second, "the second run launched", |run| !run.attempts.is_empty())
            .await;
    assert_eq!(launching.current().map(|a| a.node), Some(node2));
    // A third waits behind it; the rental is terminated: the second ends with its node, the
    // third can never run.
    let third = booked_run(&services, rental, "run-3").await;
    services.rentals.terminate(&acme, "terminate", (rental, 2)).await.expect("asked");
    observe("seen-terminated", 2, CapacityState::Terminated, 120).await;
    let ended =
        run_until(&services, second, "the second run ended", |run| run.status == RunStatus::Closed)
            .await;
    assert_eq!(ended.failure.as_ref().map(|reason| reason.as_str()), Some("NodeRetired"));
    let gone =
        run_until(&services, third, "the third run failed", |run| run.status == RunStatus::Closed)
            .await;
    assert_eq!((gone.outcome, gone.cleanup), (Some(Outcome::Failed), Some(Cleanup::NotRequired)));
    assert_eq!(gone.failure.as_ref().map(|reason| reason.as_str()), Some("RentalTerminated"));
    assert!(gone.attempts.is_empty(), "nothing was launched for it");
    // Every booking left the schedule.
    let (_, stored) = services.rentals.owned(rental).await.expect("read");
    assert_eq!((stored.schedule.running, stored.schedule.queued.len()), (None, 0));
    stop.send_replace(true);
    let _ = tokio::time::timeout(WAIT, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_asked_before_the_launch_was_answered_orders_its_stop_once_accepted() {
    let db = TestDb::migrated().await;
    let clock = leasehold_projections::ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, _, enrolled) = launched(&services, &db).await;
    services.runs.cancel(&tenant("acme"), "cancel-1", run).await.expect("cancel recorded");
    assert_eq!(count(&db, &run.stream_id(), "RunStopOrdered").await, 0, "not while launching");
    let (stop, task) = dispatching(&services, &db);
    // The node accepts the launch: the stop the cancel asked for is ordered now.
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let attempt = stored.current().expect("an attempt").clone();
    let session = session_of(&services, &enrolled);
    let applied = (attempt.operation, OperationResult::Applied);
    services.nodes.settle(&session, "launch-applied", applied).await.expect("applied");
    eventually("the stop ordered", || async {
        (count(&db, &run.stream_id(), "RunStopOrdered").await > 0).then_some(())
    })
    .await;
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

/// A run of acme's for `manifest_digest` (sha256 of `fill` repeated) booked on `rental`.
async fn run_of(services: &Services, rental: RentalId, key: &str, fill: &str) -> ManifestDigest {
    let manifest_digest =
        ManifestDigest::parse("d", format!("sha256:{}", fill.repeat(64))).expect("a valid digest");
    let ask =
        SubmitRun { rental, manifest_digest: manifest_digest.clone(), max_runtime_seconds: 60 };
    services.runs.submit(&tenant("acme"), key, &ask).await.expect("booked");
    manifest_digest
}

/// How many `prepare_image` orders of `digest` the node's stream holds.
async fn prepared(db: &TestDb, node: NodeId, digest: &ManifestDigest) -> usize {
    let events = events_of(db, &node.stream_id()).await;
    let prepares = events
        .iter()
        .filter(|e| e.event_type.as_str() == "NodeOperationRequested")
        .filter_map(|e| e.payload["order"].get("prepare_image").cloned());
    prepares.filter(|order| order["manifest_digest"] == digest.as_str()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_runs_image_is_prepared_once_on_the_node_unless_it_holds_it_hot() {
    let db = TestDb::migrated().await;
    let clock = leasehold_projections::ManualClock::at(start());
    let services = services(&db, &clock);
    let (first, _, enrolled) = launched(&services, &db).await;
    let (_, stored) = services.runs.owned(first).await.expect("read");
    let rental = stored.booking.expect("booked").rental;
    let node = node1(rental);
    let (stop, task) = dispatching(&services, &db);
    // Queued behind the running run: its image is prepared on the node ahead of its launch.
    let cold = run_of(&services, rental, "run-2", "a").await;
    eventually("the image prepared", || async {
        (prepared(&db, node, &cold).await > 0).then_some(())
    })
    .await;
    // The node reports another image hot: a run of it needs nothing prepared.
    let hot = ManifestDigest::parse("d", format!("sha256:{}", "b".repeat(64))).expect("valid");
    let mut holding = facts();
    holding.images = vec![ImageFact { manifest_digest: hot.clone(), state: Locality::Hot }];
    let session = session_of(&services, &enrolled);
    services.nodes.heartbeat(&session, "beat-hot", Some(holding)).await.expect("recorded");
    assert_eq!(run_of(&services, rental, "run-3", "b").await, hot);
    // A third, of a cold image, booked last: once its image is ordered, the dispatcher has
    // looked at every queued run again (the first's order is not repeated) and at the hot one.
    let last = run_of(&services, rental, "run-4", "c").await;
    eventually("the last image prepared", || async {
        (prepared(&db, node, &last).await > 0).then_some(())
    })
    .await;
    assert_eq!(prepared(&db, node, &cold).await, 1, "once per run and node");
    assert_eq!(prepared(&db, node, &hot).await, 0, "the node holds it hot");
    // Each went out under the node's fencing token, pending until the node answers.
    let (_, node_state) = services.nodes.owned(node).await.expect("read");
    let prepares: Vec<_> = node_state
        .operations
        .iter()
        .filter(|operation| matches!(operation.order, NodeOrder::PrepareImage { .. }))
        .collect();
    assert_eq!(prepares.len(), 2, "{prepares:?}");
    assert!(prepares.iter().all(|operation| operation.fencing_token == enrolled.fencing_token));
    stop.send_replace(true);
    let _ = tokio::time::timeout(WAIT, task).await;
}
