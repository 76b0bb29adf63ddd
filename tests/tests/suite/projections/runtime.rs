//! The runner: killed mid-batch it loses and repeats nothing; one runner per projection; a
//! clean stop keeps its checkpoint.

use std::sync::atomic::Ordering;
use std::time::Duration;

use leasehold_commands::lease_input;
use leasehold_domain::EventStore;
use leasehold_domain::lease::{LeaseCommand, LeaseFacts};
use leasehold_projections::RunnerConfig;
use leasehold_tests::TestDb;

use super::support::*;
use crate::commands::support::{self as commands, pipeline, request};

/// Writes `leases` leases of a few tenants, each with a few commands, concurrently.
async fn fill(db: &TestDb, leases: usize) {
    let pipeline = pipeline(db);
    let tasks: Vec<_> = (0..8)
        .map(|worker| {
            let pipeline = pipeline.clone();
            tokio::spawn(async move {
                for n in (worker..leases).step_by(8) {
                    let tenant = format!("tenant-{}", n % 3);
                    let lease = commands::ready_lease(&pipeline, &tenant).await;
                    let domain = format!("d{n}.example.com");
                    let command =
                        lease_input::set_custom_domain(Some("web"), Some(&domain)).expect("valid");
                    pipeline
                        .execute(request(
                            &tenant,
                            lease,
                            &format!("dom-{n}"),
                            command,
                            LeaseFacts::default(),
                        ))
                        .await
                        .expect("set");
                    if n % 2 == 0 {
                        pipeline
                            .execute(request(
                                &tenant,
                                lease,
                                &format!("down-{n}"),
                                LeaseCommand::Deprovision,
                                LeaseFacts::default(),
                            ))
                            .await
                            .expect("down");
                        let confirm = LeaseCommand::ConfirmDeprovisioned { retained: n % 4 == 0 };
                        let key = format!("gone-{n}");
                        let gone = request(&tenant, lease, &key, confirm, LeaseFacts::default());
                        pipeline.execute(gone).await.expect("gone");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("filled");
    }
}

/// The backend of the session holding the projection's lock, once it is inside a batch's
/// transaction.
async fn runner_in_transaction(db: &TestDb) -> Option<i32> {
    let client = db.client().await;
    let row = client
        .query_opt(
            "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.classid = 19528 AND l.granted \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND a.xact_start IS NOT NULL AND a.backend_xid IS NOT NULL",
            &[],
        )
        .await
        .expect("readable");
    row.map(|row| row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_mid_batch_ends_equal_to_a_rebuild() {
    let db = TestDb::migrated().await;
    let store = db.store();
    fill(&db, 240).await;
    let head = last_event(&db).await;
    let small = RunnerConfig { batch_events: 20, ..quick() };

    // Kill 1: the runner's connection is terminated while a batch's transaction is open.
    let running = start(&store, small);
    let killed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(pid) = runner_in_transaction(&db).await {
                let client = db.client().await;
                let row = client
                    .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                    .await
                    .expect("ran");
                if row.get::<_, bool>(0) {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(killed.is_ok(), "caught the runner inside a batch");
    // Kill 2: the runner's task is aborted wherever it is, and a new runner takes over.
    tokio::time::timeout(Duration::from_secs(60), running.stats.wait_for_failures(1))
        .await
        .expect("the killed session was noticed");
    running.task.abort();
    let _ = running.task.await;
    let mut restarted = start(&store, small);
    restarted.reached(head).await;
    restarted.stop().await;
    let survived = dump(&db).await;

    reset(&db).await;
    let mut rebuild = start(&store, RunnerConfig::default());
    rebuild.reached(head).await;
    rebuild.stop().await;
    let rebuilt = dump(&db).await;
    assert_usage_never_negative(&db).await;
    assert!(rebuilt.iter().all(|(_, rows)| !rows.is_empty()), "every table has rows to compare");
    assert_eq!(survived, rebuilt, "row for row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_apply_each_event_once() {
    let db = TestDb::migrated().await;
    let store = db.store();
    fill(&db, 40).await;
    let head = last_event(&db).await;
    let config = RunnerConfig { batch_events: 10, ..quick() };
    let (mut one, mut two) = (start(&store, config), start(&db.store(), config));
    // Only the runner holding the lock moves; either may.
    tokio::select! {
        () = one.reached(head) => {}
        () = two.reached(head) => {}
    }
    let total = store
        .read_log(leasehold_domain::Cursor::START, 10_000)
        .await
        .expect("readable")
        .events
        .len() as u64;
    let applied =
        one.stats.events.load(Ordering::Relaxed) + two.stats.events.load(Ordering::Relaxed);
    assert_eq!(applied, total, "every event applied by exactly one runner");
    let status =
        leasehold_adapters::PgReadModels::of(&store).projection_status().await.expect("readable");
    assert_eq!(status[0].events_applied, total);
    assert_eq!(status[0].events_behind, 0);
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn a_stopped_runner_keeps_its_checkpoint_and_resumes_from_it() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let pipeline = pipeline(&db);
    commands::ready_lease(&pipeline, "acme").await;
    let mut running = start(&store, quick());
    let first = last_event(&db).await;
    running.reached(first).await;
    running.stop().await;
    assert_eq!(
        leasehold_adapters::PgReadModels::of(&store)
            .checkpoint("lease_views")
            .await
            .expect("readable"),
        Some(first)
    );
    // While it is stopped the log grows, and the lag says so.
    commands::ready_lease(&pipeline, "acme").await;
    let second = last_event(&db).await;
    // Lag counts readable events only; other tests' open transactions may hold the horizon
    // back for a moment.
    let lagging = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let status = leasehold_adapters::PgReadModels::of(&store)
                .projection_status()
                .await
                .expect("readable");
            // Three lease events, and the lease quota's reservation in the log beside them.
            if status[0].events_behind == 4 {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the lag shows the new events");
    // Every event it read past counts, the quota reservation it has no rows for too.
    assert_eq!(lagging[0].events_applied, 4);
    assert!(lagging[0].seconds_behind >= 0.0);
    let mut running = start(&store, quick());
    running.reached(second).await;
    running.stop().await;
    let status =
        leasehold_adapters::PgReadModels::of(&store).projection_status().await.expect("readable");
    // Two leases: three lease events and a quota reservation each.
    assert_eq!((status[0].events_applied, status[0].events_behind), (8, 0));
    assert!(
        leasehold_adapters::PgReadModels::of(&store).horizon_lag_seconds().await.expect("readable")
            >= 0.0
    );
}
