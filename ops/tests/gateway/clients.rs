//! A real client no one here wrote: the npm `graphql-ws` client (pinned in
//! `tests/clients/package-lock.json`; installed by the first test that needs it).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::support::*;

/// Leases written while the client listens.
const LEASES: usize = 40;

/// Events the tenant receives of them: each lease request appends the lease's own event and
/// its reservation on the tenant's lease quota.
const EVENTS: usize = 2 * LEASES;

/// Leases written before the server restarts; the rest are written while it is down and
/// after it is back, so the client can only get them by reconnecting.
const BEFORE_RESTART: usize = 10;

/// Pace of the writer, so that writes span the server's restart.
const WRITE_EVERY: Duration = Duration::from_millis(30);

/// The pinned clients, installed.
fn install_clients() -> PathBuf {
    npm_installed(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/clients"))
}

/// Writes `LEASES` leases straight through the command pipeline, so that writing goes on
/// while the gateway restarts: `BEFORE_RESTART`, then the rest once `stopped` says the server
/// is gone.
async fn write_leases(writer: DirectWriter, stopped: tokio::sync::oneshot::Receiver<()>) {
    let mut pace = tokio::time::interval(WRITE_EVERY);
    let mut stopped = Some(stopped);
    for n in 0..LEASES {
        if n == BEFORE_RESTART {
            stopped.take().expect("once").await.expect("the test restarts the server");
        }
        pace.tick().await;
        writer.request(&format!("direct-{n}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graphql_ws_client_resumes_across_a_server_restart_without_gaps_or_duplicates() {
    let dir = install_clients();
    let mut server = Server::start().await;
    let acme = tenant_token("acme");
    let start = request_lease(&server, &acme, "first").await;
    let after = start["cursor"].as_str().expect("a cursor").to_string();
    let url = format!("{}/graphql/ws", server.base.replace("http://", "ws://"));
    let mut client = tokio::process::Command::new("node")
        .arg(dir.join("resume.mjs"))
        .args([&url, &acme, &after, &EVENTS.to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let (server_stopped, stopped) = tokio::sync::oneshot::channel();
    let mut server_stopped = Some(server_stopped);
    let writer = tokio::spawn(write_leases(DirectWriter::on(&server), stopped));

    let mut lines = BufReader::new(client.stdout.take().expect("piped")).lines();
    let mut events: Vec<Value> = Vec::new();
    let mut restarted = false;
    let summary = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.expect("readable") {
            let value: Value = serde_json::from_str(&line).expect("JSON lines");
            if value.get("done").is_some() {
                return value;
            }
            events.push(value);
            if events.len() == BEFORE_RESTART && !restarted {
                // Mid-stream: the server goes away (1012), the writer writes on, and the
                // server comes back on the same address.
                restarted = true;
                server.terminate().await;
                server_stopped.take().expect("once").send(()).expect("the writer waits");
                server.start_again().await;
            }
        }
        panic!("the client exited early");
    })
    .await
    .expect("the client finishes in time");
    writer.await.expect("the writer finishes");
    assert!(client.wait().await.expect("exits").success());
    assert!(summary["connects"].as_u64().unwrap_or_default() >= 2, "it reconnected: {summary}");

    // Exactly the log after `first`, in order, each once.
    let page = "query($after: String) { events(after: $after, first: 100) { edges { node { streamId } } } }";
    let listed = server.graphql(&acme, page, json!({ "after": after })).await;
    let listed: Vec<&Value> = data(&listed)["events"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|edge| &edge["node"]["streamId"])
        .collect();
    let received: Vec<&Value> = events.iter().map(|event| &event["streamId"]).collect();
    assert_eq!(received.len(), EVENTS);
    assert_eq!(received, listed);
}
