//! Rebuilding a projection without downtime: a new build of the lease projection is written
//! into tables of its own while writers append, the live runner applies and readers read;
//! the switch is one transaction (readers never see an empty or partial table); the new build
//! equals the old one row for row once both are caught up to one cursor; a rollback brings
//! the old one back; a rebuild killed midway goes on where it stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_adapters::PgProjectionStore;
use leasehold_adapters::projections::{BuildError, PgProjected};
use leasehold_projections::lease::LeaseProjection;
use leasehold_tests::TestDb;

use super::support::*;
use crate::commands::support::{pipeline, ready_lease};

/// Rows per batch while rebuilding: small, so a rebuild takes many batches.
const BATCH: usize = 25;

/// `leases` ready leases of three tenants, written by four workers.
async fn fill(db: &TestDb, leases: usize) {
    let pipeline = pipeline(db);
    let tasks: Vec<_> = (0..4)
        .map(|worker| {
            let pipeline = pipeline.clone();
            tokio::spawn(async move {
                for n in (worker..leases).step_by(4) {
                    ready_lease(&pipeline, &format!("tenant-{}", n % 3)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("filled");
    }
}

/// Every row of each of the lease projection's tables in `schema`, in a stable order.
async fn rows_in(db: &TestDb, schema: &str) -> Vec<(String, Vec<String>)> {
    let client = db.client().await;
    let mut dumped = Vec::new();
    for owned in <LeaseProjection as PgProjected>::TABLES {
        let table = owned.name();
        let sql = format!("SELECT t::text FROM {schema}.{table} t ORDER BY t::text");
        let rows = client.query(&sql, &[]).await.expect("readable");
        dumped.push((table.to_owned(), rows.iter().map(|row| row.get(0)).collect()));
    }
    dumped
}

/// Counts the leases readers see, over and over, failing if ever fewer than `floor` (an empty
/// or partial table), until `stop`.
fn read_until(db: &TestDb, floor: i64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let url = db.url.clone();
    tokio::spawn(async move {
        let client = url.connect().await.expect("a reader connects");
        let mut reads = 0;
        while !stop.load(Ordering::Relaxed) {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM leases), \
                     (SELECT count(*) FROM workloads WHERE kind = 'lease'), \
                     (SELECT count(*) FROM lease_view_states)",
                    &[],
                )
                .await
                .expect("a read never fails during a rebuild");
            for at in 0..3 {
                let seen: i64 = row.get(at);
                assert!(seen >= floor, "a reader saw {seen} rows of {floor}: a partial table");
            }
            reads += 1;
        }
        reads
    })
}

#[tokio::test]
async fn a_rebuild_under_writes_and_reads_switches_in_equal_and_rolls_back() {
    let db = TestDb::migrated().await;
    let store = db.store();
    fill(&db, 40).await;
    let mut running = start(&store, quick());
    running.reached(last_event(&db).await).await;
    let floor: i64 =
        db.client().await.query_one("SELECT count(*) FROM leases", &[]).await.unwrap().get(0);
    assert_eq!(floor, 40);

    // Writers append new leases and readers read throughout the rebuild and its switch.
    let stop = Arc::new(AtomicBool::new(false));
    let (wrote, mut written) = tokio::sync::watch::channel(0_u64);
    let writer = {
        let (pipeline, stop) = (pipeline(&db), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                ready_lease(&pipeline, "tenant-9").await;
                wrote.send_modify(|count| *count += 1);
            }
        })
    };
    let reader = read_until(&db, floor, Arc::clone(&stop));
    let projections = PgProjectionStore::new(store.clone());
    let mut batches = 0;
    let built = projections.rebuild(&LeaseProjection, BATCH, |_| batches += 1).await.unwrap();
    assert_eq!(built, 1);
    assert!(batches > 4, "the rebuild ran in batches: {batches}");
    // Writes go on after the switch, into the new tables.
    let switched_at = *written.borrow();
    let more = written.wait_for(|count| *count >= switched_at + 3);
    tokio::time::timeout(Duration::from_secs(60), more)
        .await
        .expect("writes go on after the switch")
        .expect("the writer runs");
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let reads = reader.await.unwrap();
    assert!(reads > 0);

    // The live runner, fenced at the switch, goes on over the new tables to the end.
    running.reached(last_event(&db).await).await;
    let status = projections.builds().await.unwrap();
    let states: Vec<(u32, &str)> = status.iter().map(|b| (b.build_no, b.state.as_str())).collect();
    assert_eq!(states, [(0, "retired"), (1, "active")]);

    // Roll back: build 0 (frozen at the switch) is active again and caught up by the runner;
    // then both builds stand at one cursor and hold the same rows.
    let tables = <LeaseProjection as PgProjected>::TABLES;
    projections.activate_build("lease_views", tables, 0).await.unwrap();
    let end = last_event(&db).await;
    checkpoint_reaches(&db, end).await;
    let checkpoint = db
        .client()
        .await
        .query_one(
            "SELECT build_no FROM projection_checkpoints WHERE projection = 'lease_views'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(checkpoint.get::<_, i32>(0), 0);
    let retired = projections.builds().await.unwrap();
    assert_eq!(retired[1].cursor, Some(end), "build 1 was retired at the end of the log");
    same_rows(rows_in(&db, "public").await, rows_in(&db, "lh_lease_views_1").await);
    assert!(running.stats.failures.load(Ordering::Relaxed) <= 2, "fenced once per switch");
    running.stop().await;

    // A kept build is dropped; the active one cannot be.
    projections.drop_build("lease_views", 1).await.unwrap();
    let refused = projections.drop_build("lease_views", 0).await;
    assert!(matches!(refused, Err(BuildError::Refused(_))), "{refused:?}");
    let schemas: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lh_lease_views_%'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(schemas, 0, "build 0 is active: its tables are in public; build 1 is dropped");
}

#[tokio::test]
async fn a_rebuild_killed_midway_goes_on_where_it_stopped() {
    let db = TestDb::migrated().await;
    let store = db.store();
    fill(&db, 30).await;
    let running = start(&store, quick());
    let mut running = running;
    running.reached(last_event(&db).await).await;
    running.stop().await;

    let projections = PgProjectionStore::new(store.clone());
    let (batched, mut first_batch) = tokio::sync::mpsc::unbounded_channel();
    let killed = {
        let projections = projections.clone();
        tokio::spawn(async move {
            projections
                .rebuild(&LeaseProjection, BATCH, |_| {
                    let _ = batched.send(());
                })
                .await
        })
    };
    first_batch.recv().await.expect("a first batch");
    killed.abort();
    assert!(killed.await.unwrap_err().is_cancelled());
    let applied = projections.builds().await.unwrap()[0].events_applied;
    assert!(applied >= BATCH as u64, "the first batch was committed: {applied}");

    // Started again (once the killed one's connection has gone and its lock with it), it
    // resumes build 1 from its checkpoint and switches it in.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let built = loop {
        match projections.rebuild(&LeaseProjection, BATCH, |_| {}).await {
            Err(BuildError::Busy(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(built, 1, "the same build, resumed");
    same_rows(rows_in(&db, "public").await, rows_in(&db, "lh_lease_views_0").await);
}

/// Waits (at most 60 s) until the lease projection's stored checkpoint is `cursor`: a runner
/// that was idle when its checkpoint was moved under it finds out at its next poll.
async fn checkpoint_reaches(db: &TestDb, cursor: leasehold_domain::Cursor) {
    let client = db.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let row = client
            .query_one(
                "SELECT position FROM projection_checkpoints WHERE projection = 'lease_views'",
                &[],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) == i64::try_from(cursor.position).unwrap() {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the runner did not catch up in 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two builds' rows are the same, table by table; else the first difference is named.
fn same_rows(left: Vec<(String, Vec<String>)>, right: Vec<(String, Vec<String>)>) {
    for ((table, ours), (_, theirs)) in left.iter().zip(&right) {
        let only_left: Vec<&String> = ours.iter().filter(|row| !theirs.contains(row)).collect();
        let only_right: Vec<&String> = theirs.iter().filter(|row| !ours.contains(row)).collect();
        assert!(
            only_left.is_empty() && only_right.is_empty(),
            "{table}: {} rows against {}; only in the first: {:?}; only in the second: {:?}",
            ours.len(),
            theirs.len(),
            only_left.first(),
            only_right.first()
        );
    }
}
