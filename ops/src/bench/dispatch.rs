//! `leasehold bench dispatch`: leases from request to ready per second at 16 clients, through
//! the whole path — the request command, the dispatcher (outbox intake, claim, a signed
//! `POST /provision` to an in-process `backend-sim`, the recorded answer), the simulator's
//! signed callback to an in-process gateway, and the report command it becomes — beside the
//! command pipeline's commands/s at 16 clients in the same run; and the p99 from request to
//! ready, beside the p50.
//!
//! Beside them, the floor of that path: the same leases, requests, signed calls, answers,
//! callbacks and reports, each client sending its own lease's work through the dispatcher's
//! kind right after its request, with no outbox, no log reader and no claim. What the floor
//! costs is what dispatching cannot avoid; the rest is what the dispatcher adds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use leasehold_adapters::backends::{BackendConfig, SigningSecret};
use leasehold_adapters::dispatch::{CallbackUrls, DispatchKind as _, LeaseDispatch, Sent, Work};
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_commands::lease_input::{ItemInput, RequestLeaseInput};
use leasehold_commands::lease_service::{Caller, LeaseService};
use leasehold_domain::lease::{BackendName, LeaseId};
use leasehold_domain::{Actor, Cursor, StreamId, TenantId};
use leasehold_gateway::{AppState, GatewayConfig, ProjectionProgress};
use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use super::{BenchArgs, Measure, report};

/// Options of `leasehold bench dispatch`.
#[derive(Debug, Clone, Args)]
pub struct DispatchBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// How long the simulated backend takes before it calls back, in milliseconds.
    #[arg(long, default_value_t = 0)]
    callback_delay_ms: u64,
}

const CLIENTS: usize = 16;
const BACKEND: &str = "sim-1";
/// The secret the in-process backend and gateway share (a benchmark's, never a real one).
const SECRET: &str = "bench-dispatch-secret-0123456789abcdef0123";

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &DispatchBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, args).await }).await
}

async fn measure_all(url: &DatabaseUrl, args: &DispatchBenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 32, ..StoreConfig::default() })?;
    let (common, duration) = (&args.common, args.common.duration());
    // The dispatcher runs first, on an empty log, so that it reads only its own leases.
    common.progress(&format!("leases from request to ready, {CLIENTS} clients"));
    let delay = Duration::from_millis(args.callback_delay_ms);
    let latencies = to_ready(&store, duration, delay, Path::Dispatcher).await?;
    common.progress(&format!("the floor of that path, {CLIENTS} clients"));
    let floor = to_ready(&store, duration, delay, Path::Floor).await?;
    common.progress(&format!("lease commands, {CLIENTS} clients (the baseline)"));
    let baseline = super::pipeline::commands(&store, CLIENTS, duration).await?;
    let rate = |latencies: &[f64]| {
        super::rate(u64::try_from(latencies.len()).unwrap_or(u64::MAX), duration)
    };
    let name = format!("dispatch_{CLIENTS}_clients");
    report(&Measure { name, value: rate(&latencies), unit: "leases/s", baseline }, common.json);
    let (p50, p99) = (percentile(&latencies, 0.50), percentile(&latencies, 0.99));
    let name = "dispatch_request_to_ready_p99".to_string();
    report(&Measure { name, value: p99, unit: "ms (baseline: p50)", baseline: p50 }, common.json);
    let name = format!("dispatch_floor_{CLIENTS}_clients");
    report(&Measure { name, value: rate(&floor), unit: "leases/s", baseline }, common.json);
    Ok(())
}

/// How a lease's work reaches its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Through the dispatcher, as `serve` sends it.
    Dispatcher,
    /// Each client sends its own lease's work through the dispatcher's kind.
    Floor,
}

/// Who waits for which lease to become ready.
type Waiters = Arc<Mutex<HashMap<StreamId, oneshot::Sender<()>>>>;

/// Runs the whole path for `duration`: the milliseconds from request to ready of every lease
/// that became ready in time.
async fn to_ready(
    store: &PgEventStore,
    duration: Duration,
    callback_delay: Duration,
    path: Path,
) -> anyhow::Result<Vec<f64>> {
    let from = leasehold_domain::EventStore::head(store).await?;
    let secret = SigningSecret::new(SECRET.as_bytes()).expect("long enough");
    let (stop, stopped) = watch::channel(false);
    let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let sim_url = format!("http://{}", sim_listener.local_addr()?);
    let sim = crate::backend_sim::spawn(sim_listener, BACKEND, secret.clone(), callback_delay)?;
    let gateway_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", gateway_listener.local_addr()?);
    let backend = BackendName::parse("backend", BACKEND).expect("a valid name");
    let config = GatewayConfig { backend: Some(backend.clone()), ..GatewayConfig::default() };
    let state = AppState::new(store.clone(), SECRET.as_bytes(), config, ProjectionProgress::new())?
        .with_callback_secret(SECRET.as_bytes())?
        .with_backend_secrets([(BACKEND.to_string(), secret.clone())]);
    let mut gateway_stopped = stopped.clone();
    let pipeline = state.pipeline().clone();
    let gateway = tokio::spawn(leasehold_gateway::serve(gateway_listener, state, async move {
        let _ = gateway_stopped.wait_for(|stopped| *stopped).await;
    }));
    let backends = crate::dispatch::clients(vec![BackendConfig::new(BACKEND, &sim_url, secret)])?;
    let manifests =
        leasehold_adapters::dispatch::ManifestVault::new(store.clone(), SECRET.as_bytes());
    let (reconcilers, kind) = match path {
        Path::Dispatcher => {
            let settings = crate::dispatch::Reconciling::default();
            let works = (backends, manifests);
            let placed = (base.as_str(), backend.clone());
            (crate::dispatch::start(&pipeline, works, placed, &settings, &stopped), None)
        }
        Path::Floor => {
            let service =
                LeaseService::new(pipeline.clone(), Some(backend.clone()), <_>::default());
            let kind = LeaseDispatch::new(service, backends, CallbackUrls::new(&base));
            (Vec::new(), Some(Arc::new(kind.with_manifests(manifests))))
        }
    };
    let waiters: Waiters = Arc::default();
    let watcher =
        tokio::spawn(watch_ready(store.clone(), from, Arc::clone(&waiters), stopped.clone()));

    // The clients go through the gateway's pipeline, as a tenant's mutations would.
    let service = LeaseService::new(pipeline, Some(backend), Default::default());
    let deadline = Instant::now() + duration;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (service, waiters, kind) = (service.clone(), Arc::clone(&waiters), kind.clone());
            tokio::spawn(client_loop(service, kind, waiters, client, deadline))
        })
        .collect();
    let mut latencies = Vec::new();
    for client in clients {
        latencies.extend(client.await.context("a client")??);
    }
    stop.send_replace(true);
    for task in reconcilers {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), gateway).await;
    watcher.abort();
    sim.abort();
    Ok(latencies)
}

/// One client: requests a lease, waits until it is ready, and again, until the deadline.
async fn client_loop(
    service: LeaseService<PgEventStore>,
    kind: Option<Arc<LeaseDispatch<PgEventStore>>>,
    waiters: Waiters,
    client: usize,
    deadline: Instant,
) -> anyhow::Result<Vec<f64>> {
    let caller = Caller {
        actor: Actor { subject: format!("bench-{client}"), role: "tenant".into() },
        tenant: Some(TenantId::parse("bench").expect("a valid name")),
        provider: None,
        namespace: None,
    };
    let input = RequestLeaseInput {
        provider_id: Uuid::nil().to_string(),
        items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 1, service_name: None }],
        payload_hash: "9f".repeat(32),
    };
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let lease = LeaseId(Uuid::now_v7());
        let (ready, is_ready) = oneshot::channel();
        lock(&waiters).insert(lease.stream_id(), ready);
        let started = Instant::now();
        let key = format!("bench-{}", lease.0.simple());
        service.request(&caller, &key, Some(lease), &input).await.context("a request")?;
        if let Some(kind) = &kind {
            send_now(kind, service.pipeline().store(), lease).await?;
        }
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(10);
        if tokio::time::timeout(left, is_ready).await.is_ok() && Instant::now() <= deadline {
            latencies.push(started.elapsed().as_secs_f64() * 1_000.0);
        }
    }
    Ok(latencies)
}

/// Sends the work `lease`'s request started, as one of the dispatcher's sends would, without
/// its outbox: the kind reads the request's event, checks the lease awaits it, calls the
/// backend and records the answer.
async fn send_now(
    kind: &LeaseDispatch<PgEventStore>,
    store: &PgEventStore,
    lease: LeaseId,
) -> anyhow::Result<()> {
    let stream = lease.stream_id();
    let events = leasehold_domain::EventStore::read_stream(store, &stream, 1, 1).await?;
    let requested = events.into_iter().next().context("the request's event")?;
    let intent = kind.intent(&requested).await?.context("the request starts work")?;
    let work = Work {
        stream: intent.stream,
        generation: intent.generation,
        tenant: intent.tenant,
        target: intent.target,
        action: intent.action.to_string(),
        request: intent.request,
        attempt: 1,
    };
    let sent = kind.send(&work, chrono::Utc::now()).await?;
    anyhow::ensure!(sent == Sent::Delivered, "the backend took the work: {sent:?}");
    Ok(())
}

/// Tails the log from `after` and tells each waiter when its lease was provisioned.
async fn watch_ready(
    store: PgEventStore,
    mut after: Cursor,
    waiters: Waiters,
    stopped: watch::Receiver<bool>,
) {
    while !*stopped.borrow() {
        let Ok(page) = store.wait_for_log(after, 1_000, Duration::from_millis(200)).await else {
            continue;
        };
        for event in &page.events {
            if event.event_type.as_str() == "LeaseProvisioned"
                && let Some(ready) = lock(&waiters).remove(&event.stream_id)
            {
                let _ = ready.send(());
            }
        }
        after = page.next;
    }
}

fn lock(waiters: &Waiters) -> std::sync::MutexGuard<'_, HashMap<StreamId, oneshot::Sender<()>>> {
    waiters.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `q` quantile of `values` (0 when there are none).
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * q).round();
    sorted.get(index as usize).copied().unwrap_or(0.0)
}
