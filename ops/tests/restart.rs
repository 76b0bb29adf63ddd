//! Issue 17, part 2, on demand: PostgreSQL itself restarted under load. `leasehold serve`
//! keeps running; `/readyz` answers 503 while the database is away and 200 again by itself;
//! every request is answered with its result or the retryable `UNAVAILABLE` (never another
//! code), and the one sent again with its key lands once; the projections resume from their
//! checkpoints (the last lease reads back through its cursor).
//!
//! A restart ends every session of the server, every other test's too, so this test is not
//! run by `cargo test --workspace` (`test = false` in `ops/Cargo.toml`). Run it alone:
//! `tests/chaos postgres-restart`, or `cargo test -p leasehold --test restart`. It restarts
//! the cluster with `pg_ctlcluster --skip-systemctl-redirect VERSION main restart` (the only
//! version under `/etc/postgresql`); `LEASEHOLD_PG_RESTART` names another command.

#[allow(dead_code, unused_imports)]
#[path = "gateway/support.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// Answers each phase waits for: before the restart, and after it.
const ANSWERS: usize = 5;

const WAIT: Duration = Duration::from_secs(120);

async fn restart_postgres() {
    let command = std::env::var("LEASEHOLD_PG_RESTART").unwrap_or_else(|_| {
        let versions = std::fs::read_dir("/etc/postgresql").expect("/etc/postgresql");
        let version = versions.flatten().next().expect("a cluster").file_name();
        let version = version.to_string_lossy().into_owned();
        format!("pg_ctlcluster --skip-systemctl-redirect {version} main restart")
    });
    let status = tokio::process::Command::new("sh").args(["-c", &command]).status().await;
    assert!(status.expect("the restart runs").success(), "{command}");
}

/// Requests leases one after another until `stop`; the answers.
async fn write(
    (base, token): (String, String),
    writer: usize,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
) -> Vec<Value> {
    let mut answered = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w{writer}-{}", answered.len());
        let mutation = ("requestLease", REQUEST_LEASE);
        answered.push(until_answered(&base, &token, mutation, lease_request(&key)).await);
        count.fetch_add(1, Ordering::Relaxed);
    }
    answered
}

/// Waits until `count` reaches `wanted`, at most [`WAIT`].
async fn reaches(count: &AtomicUsize, wanted: usize) {
    let reached = tokio::time::timeout(WAIT, async {
        while count.load(Ordering::Relaxed) < wanted {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    reached.await.expect("the writers are answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_under_load_is_waited_out_and_loses_nothing() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let (stop, count) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let to = (server.base.clone(), acme.clone());
            tokio::spawn(write(to, writer, stop.clone(), count.clone()))
        })
        .collect();
    let (not_ready, watching) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(true)));
    let watcher = {
        let (base, not_ready, watching) =
            (server.base.clone(), not_ready.clone(), watching.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while watching.load(Ordering::Relaxed) {
                let ready = http.get(format!("{base}/readyz")).send().await;
                if ready.is_ok_and(|answer| answer.status().as_u16() == 503) {
                    not_ready.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    reaches(&count, ANSWERS).await;
    let before = count.load(Ordering::Relaxed);
    restart_postgres().await;
    let after = count.load(Ordering::Relaxed);
    reaches(&count, after + ANSWERS).await;
    stop.store(true, Ordering::Relaxed);
    let mut leases = Vec::new();
    for writer in writers {
        leases.extend(writer.await.expect("a writer ran"));
    }
    watching.store(false, Ordering::Relaxed);
    watcher.await.expect("the watcher ran");
    assert!(not_ready.load(Ordering::Relaxed), "/readyz said 503 while the database was away");
    assert_eq!(server.get("/readyz").await.0, 200, "ready again, by itself");

    // Each answered lease is in the log once, and no lease was made twice by a retry.
    let observer = server.db.client().await;
    let rows = observer
        .query("SELECT stream_id, count(*) FROM events WHERE event_type = 'LeaseProvisionRequested' GROUP BY stream_id", &[])
        .await
        .expect("counted");
    let logged: std::collections::HashMap<String, i64> =
        rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    for lease in &leases {
        let stream = lease["streamId"].as_str().expect("a stream");
        assert_eq!(logged.get(stream), Some(&1), "{stream}");
    }
    assert_eq!(logged.len(), leases.len(), "a lease no answer names");
    // The projections resumed: the last lease reads back through its cursor.
    let last = leases.last().expect("leases");
    let read = json!({ "query": "query($id: ID!) { lease(id: $id) { id } }",
        "variables": { "id": last["id"] }, "extensions": { "minCursor": last["cursor"] } });
    let answer = server.answered(&acme, read).await;
    assert_eq!(data(&answer)["lease"]["id"], last["id"], "{answer}");
    let total = leases.len();
    eprintln!("restart: {total} leases answered: {before} before the restart, {after} by its end");
}
