//! `leasehold serve` killed with SIGKILL under load, again and again, and started again:
//! every mutation that was answered is in the log once, and one retried with its operation
//! key after a kill lands once; a subscription resumed from its last cursor after each kill
//! sees every event of its tenant once, in log order; at the end the read models equal a
//! from-scratch replay of the log (`events replay --compare`).
//!
//! CI kills it 3 times; `LEASEHOLD_CRASH_KILLS=10` is the long run (RELIABILITY.md).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use leasehold_domain::{Cursor, EventStore as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::support::*;

/// Clients writing at once.
const WRITERS: usize = 2;

/// Answers each kill waits for before it strikes: a few more each time.
const ANSWERS_BETWEEN_KILLS: usize = 6;

/// How long anything here may take: a restart, a retried request, the subscriber's catch-up.
const WAIT: Duration = Duration::from_secs(60);

/// The tenant's events as the subscriber received them: (stream, version).
type Received = Arc<Mutex<Vec<(String, u64)>>>;

fn kills() -> usize {
    std::env::var("LEASEHOLD_CRASH_KILLS").ok().and_then(|n| n.parse().ok()).unwrap_or(3)
}

/// Requests lease `key` until the server answers it with its result: a refused connection
/// (the server is down) or `UNAVAILABLE` is tried again with the same key.
async fn request_until_answered(base: &str, token: &str, key: &str) -> Value {
    let http = reqwest::Client::new();
    let body = json!({ "query": REQUEST_LEASE, "variables": lease_request(key) });
    let answered = tokio::time::timeout(WAIT, async {
        loop {
            let sent = http.post(format!("{base}/graphql")).bearer_auth(token).json(&body).send();
            let answer = match sent.await {
                Ok(response) => response.json::<Value>().await.ok(),
                Err(_) => None,
            };
            match answer {
                Some(answer) if code(&answer).is_none() => return answer,
                Some(answer) if code(&answer) != Some("UNAVAILABLE") => {
                    panic!("a retryable code or the result, not: {answer}")
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
    let answer = answered.await.unwrap_or_else(|_| panic!("{key} answered within {WAIT:?}"));
    data(&answer)["requestLease"].clone()
}

/// Writes leases until `stop`, each answered before the next; the answers.
async fn write(
    base: String,
    token: String,
    writer: usize,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
) -> Vec<Value> {
    let mut answered = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w{writer}-{}", answered.len());
        answered.push(request_until_answered(&base, &token, &key).await);
        count.fetch_add(1, Ordering::Relaxed);
    }
    answered
}

/// Follows `lifecycleEvents` from `after` until `stop`, reconnecting after every kill and
/// resuming from the last cursor it received.
async fn subscribe(
    base: String,
    token: String,
    mut after: Value,
    received: Received,
    stop: Arc<AtomicBool>,
) {
    let url = format!("{}/graphql/ws", base.replace("http://", "ws://"));
    while !stop.load(Ordering::Relaxed) {
        let mut request = url.clone().into_client_request().expect("a URL");
        request
            .headers_mut()
            .insert("sec-websocket-protocol", "graphql-transport-ws".parse().expect("a header"));
        let Ok((mut socket, _)) = tokio_tungstenite::connect_async(request).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let init = json!({ "type": "connection_init", "payload": { "authorization": format!("Bearer {token}") } });
        let query = "subscription($after: String) { lifecycleEvents(after: $after) { cursor streamId version } }";
        let subscribe = json!({ "type": "subscribe", "id": "1", "payload": { "query": query, "variables": { "after": after } } });
        if socket.send(Message::Text(init.to_string().into())).await.is_err()
            || socket.send(Message::Text(subscribe.to_string().into())).await.is_err()
        {
            continue;
        }
        while let Some(Ok(frame)) = socket.next().await {
            let Message::Text(text) = frame else { continue };
            let message: Value = serde_json::from_str(&text).expect("JSON");
            if message["type"] == "next" {
                let event = &message["payload"]["data"]["lifecycleEvents"];
                let stream = event["streamId"].as_str().expect("a stream").to_owned();
                let version = event["version"].as_u64().expect("a version");
                received.lock().expect("not poisoned").push((stream, version));
                after = event["cursor"].clone();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_under_load_loses_nothing_repeats_nothing_and_resumes_its_feeds() {
    let mut server = Server::start().await;
    let acme = tenant_token("acme");
    let start = request_lease(&server, &acme, "start").await;
    let (stop, unsubscribe) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let count = Arc::new(AtomicUsize::new(0));
    let received = Received::default();
    let subscriber = tokio::spawn(subscribe(
        server.base.clone(),
        acme.clone(),
        start["cursor"].clone(),
        received.clone(),
        unsubscribe.clone(),
    ));
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            tokio::spawn(write(
                server.base.clone(),
                acme.clone(),
                writer,
                stop.clone(),
                count.clone(),
            ))
        })
        .collect();
    for kill in 1..=kills() {
        let wanted = count.load(Ordering::Relaxed) + ANSWERS_BETWEEN_KILLS + kill;
        let answered = tokio::time::timeout(WAIT, async {
            while count.load(Ordering::Relaxed) < wanted {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        answered.await.expect("the writers are answered");
        server.child.start_kill().expect("SIGKILL sent");
        server.child.wait().await.expect("it died");
        server.start_again().await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut leases = vec![start];
    for writer in writers {
        leases.extend(writer.await.expect("a writer ran"));
    }

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

    // The subscription saw each of its tenant's events after its start once, in log order.
    let store = server.db.store();
    let from: String = leasehold_gateway::cursor::CursorKey::derive(SECRET.as_bytes())
        .open(
            leasehold_gateway::cursor::CursorKind::Log,
            "tenant:acme",
            "after",
            leases[0]["cursor"].as_str().expect("a cursor"),
        )
        .expect("the start cursor opens");
    let head = server.db.settled_head().await;
    let mut expected = Vec::new();
    let mut after: Cursor = from.parse().expect("a cursor");
    while after < head {
        let page = store.read_log(after, 1_000).await.expect("the log");
        expected.extend(
            page.events
                .iter()
                .filter(|e| e.tenant_id.as_str() == "acme")
                .map(|e| (e.stream_id.as_str().to_owned(), e.version)),
        );
        after = page.next;
    }
    let caught_up = tokio::time::timeout(WAIT, async {
        while received.lock().expect("not poisoned").len() < expected.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    if caught_up.await.is_err() {
        let received = received.lock().expect("not poisoned").len();
        panic!("the subscriber received {received} of {} events in time", expected.len());
    }
    unsubscribe.store(true, Ordering::Relaxed);
    subscriber.abort();
    assert_eq!(*received.lock().expect("not poisoned"), expected);

    // The read models equal a replay of the whole log, once the projections have caught up.
    replay_equals_read_models(&server).await;
}

/// Exports the log and replays it against the live read models until they agree (the
/// projections may still be catching up after the last restart), at most [`WAIT`].
async fn replay_equals_read_models(server: &Server) {
    let url = server.database_url();
    let file = std::env::temp_dir().join(format!("lh-crash-{}.ndjson", uuid::Uuid::now_v7()));
    let path = file.to_str().expect("a path").to_owned();
    let agreed = tokio::time::timeout(WAIT, async {
        loop {
            let export = cli(&["events", "export", "--database-url", &url, "-o", &path]).await;
            assert!(export.status.success(), "{export:?}");
            let replay = cli(&["events", "replay", "--from", &path, "--compare", &url]).await;
            let out = String::from_utf8_lossy(&replay.stdout).into_owned();
            if replay.status.success() {
                return;
            }
            // Behind is waited for; a row that differs once caught up is a failure.
            assert!(!out.contains("DIFFERS") || out.contains("has not reached"), "{out}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let result = agreed.await;
    let _ = std::fs::remove_file(&file);
    result.expect("the read models equal a replay of the log");
}

async fn cli(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env("LEASEHOLD_LOG", "warn")
        .output()
        .await
        .expect("the leasehold binary runs")
}
