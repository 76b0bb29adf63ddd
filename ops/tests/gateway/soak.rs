//! Issue 17, part 6: many HTTP clients and many subscriptions on one `leasehold serve` for a
//! while. Every request is answered; every subscription receives each of its tenant's events
//! once; the server's memory is sampled all along (peak RSS reported); and once the clients
//! leave, no connection, WebSocket, subscription, shared selection or task is left behind.
//!
//! CI: 50 HTTP clients and 100 subscriptions for 5 s. The long run (RELIABILITY.md):
//! `LEASEHOLD_SOAK_SECONDS=300 LEASEHOLD_SOAK_CLIENTS=500 LEASEHOLD_SOAK_SUBSCRIPTIONS=1000`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::support::*;

/// Tenants the load is spread over.
const TENANTS: usize = 4;

/// One request in this many is a mutation; the rest read a page of leases.
const MUTATION_EVERY: usize = 10;

/// How long anything may take to settle: subscriptions to start, deliveries to arrive,
/// resources to be given back.
const SETTLE: Duration = Duration::from_secs(120);

/// Tasks a server may have running beyond its count at rest (background work that happens to
/// be running when it is read); a leak of one per client or subscription is far above it.
const TASK_SLACK: f64 = 8.0;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn tenant(n: usize) -> String {
    format!("soak{}", n % TENANTS)
}

/// A value of the server's `/metrics`, read on a connection of its own that is closed after
/// (a pooled one would stay open and count as a client's).
async fn metric(server: &Server, name: &str) -> f64 {
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("a client");
    let response = http.get(format!("{}/metrics", server.base)).send().await.expect("answers");
    let text = response.text().await.expect("text");
    let line = text.lines().find(|line| line.starts_with(&format!("{name} ")));
    let value = line.and_then(|line| line.split(' ').nth(1)).and_then(|v| v.parse().ok());
    value.unwrap_or_else(|| panic!("{name} in /metrics"))
}

/// Waits until `check` holds, at most [`SETTLE`].
async fn settled<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < SETTLE, "{what} within {SETTLE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The process's resident memory now and at its peak, in MiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        let line = status.lines().find(|line| line.starts_with(name));
        let kb = line.and_then(|line| line.split_whitespace().nth(1)).and_then(|v| v.parse().ok());
        kb.unwrap_or(0u64) / 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Established TCP connections whose local end is `port` (the server's ends of its clients'
/// connections), from the kernel's table.
fn connections_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("the kernel's TCP table");
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "01"
        })
        .count()
}

/// What one subscription received: (stream, version) pairs, and any repeated.
#[derive(Default)]
struct Feed {
    seen: HashSet<(String, u64)>,
    repeated: usize,
}

type Feeds = Arc<Vec<Mutex<Feed>>>;

/// Opens subscription `n` and follows it until the socket is dropped (`stop`).
async fn subscribe(base: String, n: usize, feeds: Feeds, stop: tokio::sync::watch::Receiver<bool>) {
    let url = format!("{}/graphql/ws", base.replace("http://", "ws://"));
    let mut request = url.into_client_request().expect("a URL");
    let protocol = "graphql-transport-ws".parse().expect("a header");
    request.headers_mut().insert("sec-websocket-protocol", protocol);
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.expect("connects");
    let token = tenant_token(&tenant(n));
    let init = json!({ "type": "connection_init", "payload": { "authorization": format!("Bearer {token}") } });
    let query = "subscription { lifecycleEvents { cursor streamId version } }";
    let subscribe = json!({ "type": "subscribe", "id": "1", "payload": { "query": query } });
    socket.send(Message::Text(init.to_string().into())).await.expect("sent");
    socket.send(Message::Text(subscribe.to_string().into())).await.expect("sent");
    let mut stop = stop;
    loop {
        let frame = tokio::select! {
            frame = socket.next() => frame,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let Some(Ok(Message::Text(text))) = frame else {
            assert!(*stop.borrow(), "subscription {n} ended early: {frame:?}");
            break;
        };
        let message: Value = serde_json::from_str(&text).expect("JSON");
        if message["type"] == "next" {
            let event = &message["payload"]["data"]["lifecycleEvents"];
            let key = (
                event["streamId"].as_str().expect("a stream").to_owned(),
                event["version"].as_u64().expect("a version"),
            );
            let mut feed = feeds[n].lock().expect("not poisoned");
            if !feed.seen.insert(key) {
                feed.repeated += 1;
            }
        } else {
            assert_ne!(message["type"], "error", "subscription {n}: {message}");
        }
    }
}

/// Latencies of one kind of request, in ms.
type Latencies = Arc<Mutex<Vec<f64>>>;

/// Sends requests until `until`: a lease first and every [`MUTATION_EVERY`]th request after,
/// a page of leases otherwise.
async fn client(
    (base, http): (String, reqwest::Client),
    (n, tenant): (usize, String),
    until: Instant,
    latencies: (Latencies, Latencies),
) {
    let token = tenant_token(&tenant);
    let page = json!({ "query": "{ leases(first: 20) { edges { node { id status } } } }" });
    for i in 0.. {
        if Instant::now() >= until {
            break;
        }
        // The first request writes: even a short warm-up starts what writing starts.
        let mutation = i % MUTATION_EVERY == 0;
        let body = if mutation {
            json!({ "query": REQUEST_LEASE, "variables": lease_request(&format!("c{n}-{i}")) })
        } else {
            page.clone()
        };
        let started = Instant::now();
        let sent = http.post(format!("{base}/graphql")).bearer_auth(&token).json(&body).send();
        let response = sent.await.expect("answered");
        assert_eq!(response.status().as_u16(), 200);
        let answer: Value = response.json().await.expect("JSON");
        assert!(answer.get("errors").is_none(), "client {n}: {answer}");
        let took = started.elapsed().as_secs_f64() * 1000.0;
        let into = if mutation { &latencies.1 } else { &latencies.0 };
        into.lock().expect("not poisoned").push(took);
    }
}

fn percentile(values: &Latencies, p: f64) -> f64 {
    let mut values = values.lock().expect("not poisoned").clone();
    values.sort_by(f64::total_cmp);
    values
        .get(((values.len() as f64 * p) as usize).min(values.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_under_many_clients_answers_all_delivers_all_and_keeps_nothing_after() {
    let (seconds, clients) =
        (setting("LEASEHOLD_SOAK_SECONDS", 5), setting("LEASEHOLD_SOAK_CLIENTS", 50));
    let subscriptions = setting("LEASEHOLD_SOAK_SUBSCRIPTIONS", 100) as usize;
    let server = Server::start().await;
    let pid = server.child.id().expect("running");
    let port: u16 = server.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
    // A moment of load first fills the server's connection pools (a task per connection to
    // PostgreSQL, kept while it lives): the count at rest is taken once they are full.
    let warm = reqwest::Client::new();
    let (queries, mutations) = (Latencies::default(), Latencies::default());
    let until = Instant::now() + Duration::from_secs(1);
    let warming: Vec<_> = (0..clients as usize)
        .map(|n| {
            let latencies = (queries.clone(), mutations.clone());
            // Another tenant: its events are not the subscriptions' to receive.
            let to = (server.base.clone(), warm.clone());
            tokio::spawn(client(to, (n, "warmup".into()), until, latencies))
        })
        .collect();
    for client in warming {
        client.await.expect("a client ran");
    }
    drop(warm);
    settled("the warm-up's connections closed", || async { connections_to(port) == 0 }).await;
    let tasks_at_rest = metric(&server, "leasehold_runtime_tasks_alive").await;

    let feeds: Feeds = Arc::new((0..subscriptions).map(|_| Mutex::default()).collect());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let subscribers: Vec<_> = (0..subscriptions)
        .map(|n| tokio::spawn(subscribe(server.base.clone(), n, feeds.clone(), stopped.clone())))
        .collect();
    let wanted = subscriptions as f64;
    settled("every subscription running", || async {
        metric(&server, "leasehold_subscriptions_active").await == wanted
    })
    .await;

    let peak_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak_rss = peak_rss.clone();
        tokio::spawn(async move {
            loop {
                peak_rss.fetch_max(memory(pid).0, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let (queries, mutations) = (Latencies::default(), Latencies::default());
    let until = Instant::now() + Duration::from_secs(seconds);
    let http = reqwest::Client::new();
    let load: Vec<_> = (0..clients as usize)
        .map(|n| {
            let to = (server.base.clone(), http.clone());
            let latencies = (queries.clone(), mutations.clone());
            tokio::spawn(client(to, (n, tenant(n)), until, latencies))
        })
        .collect();
    for client in load {
        client.await.expect("a client ran");
    }
    let tasks_under_load = metric(&server, "leasehold_runtime_tasks_alive").await;

    // Every subscription receives each of its tenant's events once.
    let observer = server.db.client().await;
    let mut logged = Vec::new();
    for n in 0..TENANTS {
        let count = "SELECT count(*) FROM events WHERE tenant_id = $1";
        let row = observer.query_one(count, &[&tenant(n)]).await.expect("counted");
        logged.push(row.get::<_, i64>(0) as usize);
    }
    settled("every event delivered", || async {
        (0..subscriptions)
            .all(|n| feeds[n].lock().expect("not poisoned").seen.len() >= logged[n % TENANTS])
    })
    .await;
    for (n, feed) in feeds.iter().enumerate() {
        let feed = feed.lock().expect("not poisoned");
        assert_eq!((feed.seen.len(), feed.repeated), (logged[n % TENANTS], 0), "subscription {n}");
    }
    sampler.abort();
    let (_, peak) = memory(pid);

    // Once the clients leave, nothing of theirs is left in the server.
    stop.send(true).expect("subscribers listen");
    for subscriber in subscribers {
        subscriber.await.expect("a subscriber ran");
    }
    drop(http);
    settled("every WebSocket, subscription and selection gone", || async {
        metric(&server, "leasehold_websockets_open").await == 0.0
            && metric(&server, "leasehold_subscriptions_active").await == 0.0
            && metric(&server, "leasehold_live_selections").await == 0.0
    })
    .await;
    settled("every client connection closed", || async { connections_to(port) == 0 }).await;
    let tasks = Arc::new(Mutex::new(Vec::new()));
    let result = tokio::time::timeout(SETTLE, async {
        loop {
            let now = metric(&server, "leasehold_runtime_tasks_alive").await;
            tasks.lock().expect("not poisoned").push(now);
            if now <= tasks_at_rest + TASK_SLACK {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    let seen = tasks.lock().expect("not poisoned").clone();
    assert!(
        result.is_ok(),
        "tasks back to {tasks_at_rest} at rest (+{TASK_SLACK}); under load {tasks_under_load}, then {seen:?}"
    );
    let tasks_after = metric(&server, "leasehold_runtime_tasks_alive").await;
    let (rss_after, _) = memory(pid);
    let delivered: usize =
        feeds.iter().map(|feed| feed.lock().expect("not poisoned").seen.len()).sum();
    let (asked, wrote) =
        (queries.lock().expect("a list").len(), mutations.lock().expect("a list").len());
    let (q50, q99) = (percentile(&queries, 0.5), percentile(&queries, 0.99));
    let (m50, m99) = (percentile(&mutations, 0.5), percentile(&mutations, 0.99));
    eprintln!(
        "soak: {seconds} s, {clients} HTTP clients, {subscriptions} subscriptions: {asked} \
         queries (p50 {q50:.1} ms, p99 {q99:.1} ms), {wrote} mutations (p50 {m50:.1} ms, p99 \
         {m99:.1} ms), {delivered} events delivered, 0 repeated; RSS peak {peak} MiB (sampled \
         {} MiB), after {rss_after} MiB; tasks at rest {tasks_at_rest}, after the load \
         {tasks_under_load}, after the clients left {tasks_after}",
        peak_rss.load(Ordering::Relaxed),
    );
    assert!(wrote > 0, "the load wrote");
}
