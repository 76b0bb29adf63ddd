//! Commit-to-delivery latency of `lifecycleEvents` with many subscriptions on one gateway,
//! while writers append at a steady rate; each subscriber's events are checked against the
//! log for gaps and duplicates. The baseline is PostgreSQL's own push: a NOTIFY sent in the
//! writing transaction, received on a LISTEN connection.
//!
//! Both are timed from the moment the writer starts its write (the command, or the
//! BEGIN..COMMIT batch) to the moment the event arrives: the instant of the commit itself is
//! not observable from outside, and timing from the commit's return would let a NOTIFY that
//! arrives before the writer wakes count as zero. So each figure is an upper bound on
//! commit-to-delivery that includes the write's own latency, the same way for both.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::{SinkExt as _, StreamExt as _};
use leasehold_adapters::DatabaseUrl;
use leasehold_commands::lease_input::{self, ItemInput, LeaseInputLimits, RequestLeaseInput};
use leasehold_commands::{CommandPipeline, CommandRequest, PipelineConfig};
use leasehold_domain::lease::{BackendName, Lease, LeaseFacts, LeaseId};
use leasehold_domain::{Actor, Cursor, EventStore as _, OperationKey, TenantId};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use super::{Gateway, TENANT, latency_measures};
use crate::bench::Measure;

/// Writes before the timed ones (see `measure`).
const WARMUP: Duration = Duration::from_secs(2);

/// How long every subscriber may take to receive the last event after the writers stop.
const DRAIN_WAIT: Duration = Duration::from_secs(120);

/// The subscription every subscriber runs.
const SUBSCRIPTION: &str =
    "subscription($after: String) { lifecycleEvents(after: $after) { cursor streamId version } }";

/// How hard to push.
#[derive(Debug, Clone)]
pub struct Load {
    /// Concurrent subscriptions.
    pub subscriptions: usize,
    /// Subscriptions a socket carries.
    pub per_socket: usize,
    /// Appends per second.
    pub events_per_second: u64,
    /// How long the writers write.
    pub duration: Duration,
}

/// An event as subscribers and the log name it: its stream and version. (A stream id alone
/// repeats: every lease request also appends to its tenant's quota stream.)
type EventKey = (String, u64);

/// What one subscriber received: each event with when it arrived.
type Received = Arc<Mutex<Vec<(EventKey, Instant)>>>;

/// p50/p99 delivery latency beside NOTIFY's, and the gaps and duplicates seen.
pub async fn measure(
    url: &DatabaseUrl,
    gateway: &Gateway,
    load: &Load,
) -> anyhow::Result<Vec<Measure>> {
    let baseline = notify_latencies(url, load).await?;
    let start = start_cursor(gateway).await?;
    let mut subscribers = Vec::with_capacity(load.subscriptions);
    let mut sockets = Vec::new();
    let mut left = load.subscriptions;
    while left > 0 {
        let received: Vec<Received> =
            (0..left.min(load.per_socket)).map(|_| Arc::default()).collect();
        left -= received.len();
        let connection = (gateway.base.clone(), gateway.token.clone());
        sockets.push(tokio::spawn(subscribe(connection, start.1.clone(), received.clone())));
        subscribers.extend(received);
    }
    // The first second after a thousand subscriptions start is their set-up, not delivery:
    // written and checked for gaps and duplicates, but not timed.
    let warmup = Load { duration: WARMUP, ..load.clone() };
    write(gateway, &warmup).await?;
    let written = write(gateway, load).await?;
    // Every event of the log since the start, the writers' and their quota reservations'.
    let order = log_order(gateway, start.0).await?;
    let drained = Instant::now() + DRAIN_WAIT;
    let total = order.len();
    while subscribers.iter().any(|received| lock(received).len() < total)
        && Instant::now() < drained
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for task in &sockets {
        task.abort();
    }
    let (mut latencies, mut gaps, mut duplicates, mut reordered) = (Vec::new(), 0u64, 0u64, 0u64);
    for received in &subscribers {
        let received = lock(received).clone();
        let events: Vec<&EventKey> = received.iter().map(|(event, _)| event).collect();
        let unique: HashSet<&EventKey> = events.iter().copied().collect();
        duplicates += (events.len() - unique.len()) as u64;
        gaps += order.iter().filter(|event| !unique.contains(event)).count() as u64;
        reordered += u64::from(events.iter().zip(&order).any(|(got, want)| *got != want));
        // Timed: each lease's first event (its quota reservation's stream was not written by
        // the writer alone).
        for ((stream, version), at) in &received {
            if let (1, Some(committed)) = (version, written.get(stream)) {
                latencies.push(at.saturating_duration_since(*committed));
            }
        }
    }
    let mut measures = latency_measures("delivery", latencies, baseline);
    for (name, value) in [
        ("delivery_gaps", gaps),
        ("delivery_duplicates", duplicates),
        ("delivery_reordered_subscribers", reordered),
    ] {
        measures.push(Measure {
            name: name.into(),
            value: value as f64,
            unit: "count",
            baseline: 0.0,
        });
    }
    Ok(measures)
}

fn lock(received: &Received) -> std::sync::MutexGuard<'_, Vec<(EventKey, Instant)>> {
    received.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The log's head and a cursor sealed for the bench tenant that stands for it: one lease is
/// requested over GraphQL and its cursor is used.
async fn start_cursor(gateway: &Gateway) -> anyhow::Result<(Cursor, String)> {
    let mutation =
        "mutation($input: RequestLeaseInput!) { requestLease(input: $input) { cursor } }";
    let input = json!({ "operationKey": "bench-start", "providerId": "00000000-0000-0000-0000-000000000007",
        "items": [{ "sku": "gpu.h100.1x", "quantity": 1 }], "payload": "bench" });
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/graphql", gateway.base))
        .bearer_auth(&gateway.token)
        .json(&json!({ "query": mutation, "variables": { "input": input } }))
        .send()
        .await?
        .json()
        .await?;
    let sealed =
        answer["data"]["requestLease"]["cursor"].as_str().context("a start cursor")?.to_string();
    // Where the subscribers start: the position the sealed cursor stands for.
    let key = leasehold_gateway::cursor::CursorKey::derive(super::SECRET);
    let scope = format!("tenant:{TENANT}");
    let position: String = key
        .open(leasehold_gateway::cursor::CursorKind::Log, &scope, "after", &sealed)
        .map_err(|error| anyhow::anyhow!("the start cursor does not open: {}", error.message))?;
    Ok((position.parse().map_err(|_| anyhow::anyhow!("a malformed start cursor"))?, sealed))
}

/// One socket: connect, init, subscribe once for each of `received` (ids "0", "1", ...)
/// after `after`, record every event's arrival with its subscription.
async fn subscribe(
    (base, token): (String, String),
    after: String,
    received: Vec<Received>,
) -> anyhow::Result<()> {
    let url = format!("{}/graphql/ws", base.replace("http://", "ws://"));
    let mut request = url.into_client_request()?;
    request.headers_mut().insert("sec-websocket-protocol", "graphql-transport-ws".parse()?);
    let (mut socket, _) = tokio_tungstenite::connect_async_with_config(request, None, true).await?;
    let init = json!({ "type": "connection_init", "payload": { "authorization": format!("Bearer {token}") } });
    socket.send(Message::Text(init.to_string().into())).await?;
    for id in 0..received.len() {
        let payload = json!({ "query": SUBSCRIPTION, "variables": { "after": after } });
        let subscribe = json!({ "type": "subscribe", "id": id.to_string(), "payload": payload });
        socket.send(Message::Text(subscribe.to_string().into())).await?;
    }
    while let Some(frame) = socket.next().await {
        let Message::Text(text) = frame? else { continue };
        let message: Value = serde_json::from_str(&text)?;
        if message["type"] == "next" {
            let event = &message["payload"]["data"]["lifecycleEvents"];
            let key = (
                event["streamId"].as_str().unwrap_or_default().to_string(),
                event["version"].as_u64().unwrap_or_default(),
            );
            let id: Option<usize> = message["id"].as_str().and_then(|id| id.parse().ok());
            if let Some(received) = id.and_then(|id| received.get(id)) {
                lock(received).push((key, Instant::now()));
            }
        }
    }
    Ok(())
}

/// Appends lease requests at the load's rate for its duration; each stream id with when its
/// write started.
async fn write(gateway: &Gateway, load: &Load) -> anyhow::Result<HashMap<String, Instant>> {
    let pipeline = CommandPipeline::new(gateway.store.clone(), PipelineConfig::default());
    let mut pace =
        tokio::time::interval(Duration::from_secs_f64(1.0 / load.events_per_second as f64));
    let deadline = Instant::now() + load.duration;
    let mut written = HashMap::new();
    let backend = BackendName::parse("backend", "local")?;
    let tenant = TenantId::parse(TENANT)?;
    while Instant::now() < deadline {
        pace.tick().await;
        let lease = LeaseId(uuid::Uuid::now_v7());
        let input = RequestLeaseInput {
            provider_id: "00000000-0000-0000-0000-000000000007".into(),
            items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 1, service_name: None }],
            payload_hash: "ab".repeat(32),
        };
        let operation = leasehold_domain::lease::OperationId(lease.0);
        let limits = LeaseInputLimits::default();
        let command = lease_input::request_provision(lease, operation, &input, limits)?;
        let request = CommandRequest::<Lease>::new(
            tenant.clone(),
            Actor { subject: "bench-writer".into(), role: "tenant".into() },
            lease.stream_id(),
            OperationKey::parse(format!("bench-{}", lease.0.simple()))?,
            command,
            LeaseFacts { backend: Some(backend.clone()), ..LeaseFacts::default() },
        );
        let started = Instant::now();
        let outcome =
            pipeline.execute(request).await.map_err(|error| anyhow::anyhow!("{error}"))?;
        written.insert(outcome.stream_id.as_str().to_string(), started);
    }
    Ok(written)
}

/// The events of the log after `start`, in log order.
async fn log_order(gateway: &Gateway, start: Cursor) -> anyhow::Result<Vec<EventKey>> {
    let mut order = Vec::new();
    let mut after = start;
    loop {
        let page = gateway.store.read_log(after, 1_000).await?;
        if page.events.is_empty() {
            return Ok(order);
        }
        order.extend(
            page.events.iter().map(|event| (event.stream_id.as_str().to_string(), event.version)),
        );
        after = page.next;
    }
}

/// NOTIFY in the writing transaction at the same rate, timed from the write's start to its
/// arrival at one LISTEN connection.
async fn notify_latencies(url: &DatabaseUrl, load: &Load) -> anyhow::Result<Vec<Duration>> {
    let (listener, mut connection) = url.config().connect(tokio_postgres::NoTls).await?;
    let (sender, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(note) = message {
                let _ = sender.send((note.payload().to_string(), Instant::now()));
            }
        }
    });
    listener.batch_execute("LISTEN bench_delivery").await?;
    let writer = url.connect().await?;
    writer.batch_execute("CREATE TABLE IF NOT EXISTS bench_notify (n bigint)").await?;
    let mut pace =
        tokio::time::interval(Duration::from_secs_f64(1.0 / load.events_per_second as f64));
    let deadline = Instant::now() + load.duration;
    let mut committed = HashMap::new();
    let mut n = 0u64;
    while Instant::now() < deadline {
        pace.tick().await;
        n += 1;
        committed.insert(n.to_string(), Instant::now());
        writer
            .batch_execute(&format!(
                "BEGIN; INSERT INTO bench_notify VALUES ({n}); NOTIFY bench_delivery, '{n}'; COMMIT"
            ))
            .await?;
    }
    let mut latencies = Vec::with_capacity(committed.len());
    while latencies.len() < committed.len() {
        let arrived = tokio::time::timeout(DRAIN_WAIT, notifications.recv()).await?;
        let (payload, at) = arrived.context("the listener stopped")?;
        if let Some(sent) = committed.get(&payload) {
            latencies.push(at.saturating_duration_since(*sent));
        }
    }
    Ok(latencies)
}
