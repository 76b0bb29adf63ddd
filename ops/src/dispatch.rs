//! The dispatchers and reconcilers `serve` runs: the lease backends' dispatcher, inventory
//! reconciler and health probes, when a backends file says how to reach them
//! (`--backends-file`); without it leases are recorded and never sent anywhere (their
//! backends report through the agent mutations and callbacks). The retention reaper runs
//! whenever a retention limit is set.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use leasehold_adapters::backends::status::PgBackendStatus;
use leasehold_adapters::backends::{BackendClient, BackendConfig, config, health};
use leasehold_adapters::dispatch::{
    Backends, Backoff, CallbackUrls, Dispatcher, LeaseDispatch, ManifestVault, PgOutbox,
};
use leasehold_adapters::inventory::Inventory;
use leasehold_adapters::retention::{RetentionPolicy, RetentionReaper};
use leasehold_adapters::{PgEventStore, PgProjectionStore};
use leasehold_commands::lease_service::LeaseService;
use leasehold_commands::{CommandPipeline, SystemClock};
use leasehold_domain::lease::BackendName;
use leasehold_projections::{ReconcilerConfig, ReconcilerRunner};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The backends the backends file names, each with its HTTP client (one breaker per backend,
/// shared by the router and the dispatcher), and their names in the file's order.
///
/// # Errors
/// The backends file cannot be used, or a client cannot be built.
pub fn backends(backends_file: &Path) -> anyhow::Result<(Backends, Vec<String>)> {
    let configs = config::load(backends_file).context("--backends-file")?;
    let clock = Arc::new(SystemClock);
    let mut clients = Vec::new();
    for config in configs {
        let name = config.name.clone();
        let client = BackendClient::new(config, clock.clone())
            .with_context(|| format!("the HTTP client of backend {name}"))?;
        clients.push(client);
    }
    let names = clients.iter().map(|client| client.name().to_string()).collect();
    Ok((Backends::new(clients), names))
}

/// The clients of `configs`.
///
/// # Errors
/// A client cannot be built.
pub fn clients(configs: Vec<BackendConfig>) -> anyhow::Result<Backends> {
    let clock = Arc::new(SystemClock);
    let clients: Result<Vec<_>, _> =
        configs.into_iter().map(|config| BackendClient::new(config, clock.clone())).collect();
    Ok(Backends::new(clients.context("a backend's HTTP client")?))
}

/// How the lease reconcilers `serve` runs beside the dispatcher are set.
#[derive(Debug, Clone)]
pub struct Reconciling {
    /// How often each backend's inventory is swept.
    pub inventory_every: chrono::TimeDelta,
    /// How often each backend is probed for health.
    pub health_every: std::time::Duration,
    /// How long released leases' data is kept after each lease was created.
    pub retention_max_age: Option<chrono::TimeDelta>,
    /// When retained data is reaped.
    pub retention: RetentionPolicy,
    /// How long a backend has to call back after taking work.
    pub callback_deadline: chrono::TimeDelta,
}

impl Default for Reconciling {
    fn default() -> Self {
        Self {
            inventory_every: chrono::TimeDelta::seconds(60),
            health_every: std::time::Duration::from_secs(10),
            retention_max_age: None,
            retention: RetentionPolicy::default(),
            callback_deadline: leasehold_adapters::dispatch::CALLBACK_DEADLINE,
        }
    }
}

/// The lease service the reconcilers issue commands through, over the process's one pipeline:
/// its state cache then holds what the gateway's commands just appended, so the dispatcher's
/// answer and the backend's report are decided without reading the lease back.
fn service(
    pipeline: &CommandPipeline<PgEventStore>,
    placed_on: BackendName,
    settings: &Reconciling,
) -> LeaseService<PgEventStore> {
    LeaseService::new(pipeline.clone(), Some(placed_on), Default::default())
        .with_retention_max_age(settings.retention_max_age)
}

fn run<R: leasehold_projections::Reconciler>(
    reconciler: R,
    store: &PgEventStore,
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let runner = ReconcilerRunner::new(
        reconciler,
        PgProjectionStore::new(store.clone()),
        ReconcilerConfig::new(Arc::new(SystemClock)),
    );
    tokio::spawn(runner.run(stopped.clone()))
}

/// Starts the lease dispatcher over `backends`, the inventory reconciler and the health
/// probes; they stop when `stopped` turns true. `callback_base` is the URL backends reach this
/// gateway at; leases without a router's choice are placed on `placed_on`.
pub fn start(
    pipeline: &CommandPipeline<PgEventStore>,
    (backends, manifests): (Backends, ManifestVault),
    (callback_base, placed_on): (&str, BackendName),
    settings: &Reconciling,
    stopped: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let store = pipeline.store();
    let kind = LeaseDispatch::new(
        service(pipeline, placed_on.clone(), settings),
        backends.clone(),
        CallbackUrls::new(callback_base),
    )
    .with_manifests(manifests)
    .with_callback_deadline(settings.callback_deadline);
    let dispatcher = Dispatcher::new(kind, PgOutbox::new(store.clone()), Backoff::default());
    let inventory = Inventory::new(
        service(pipeline, placed_on, settings),
        backends.clone(),
        store.clone(),
        settings.inventory_every,
    );
    vec![
        run(dispatcher, store, stopped),
        run(inventory, store, stopped),
        tokio::spawn(probe(backends, store.clone(), settings.health_every, stopped.clone())),
    ]
}

/// Starts the VM dispatcher: boots and destroys sent to host agents over fuse's contract,
/// through `vms` (the gateway's VM service), with each host's token from `vault`. It stops
/// when `stopped` turns true.
///
/// # Errors
/// The host agents' HTTP client cannot be built.
pub fn start_vm_dispatcher(
    vms: &leasehold_gateway::VmService,
    vault: &leasehold_adapters::vault::PgCredentialVault,
    timeout: std::time::Duration,
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let agents = host_agents(timeout)?;
    let kind = leasehold_adapters::dispatch::VmDispatch::new(
        vms.clone(),
        (agents, timeout),
        vault.clone(),
    );
    Ok(run_dispatcher(kind, vms.pipeline().store(), stopped))
}

/// The HTTP client every host agent is called with (exchanges of at most `timeout`).
fn host_agents(
    timeout: std::time::Duration,
) -> anyhow::Result<leasehold_adapters::hosts::HostAgentClient> {
    leasehold_adapters::hosts::HostAgentClient::new(timeout).context("the host agents' HTTP client")
}

/// Runs a dispatcher of `kind`'s work from the outbox of `store`'s database.
fn run_dispatcher<K: leasehold_adapters::dispatch::DispatchKind>(
    kind: K,
    store: &PgEventStore,
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let dispatcher = Dispatcher::new(kind, PgOutbox::new(store.clone()), Backoff::default());
    run(dispatcher, store, stopped)
}

/// Starts the snapshot dispatcher: snapshots, restores and deletions sent to host agents.
///
/// # Errors
/// The host agents' HTTP client cannot be built.
pub fn start_snapshot_dispatcher(
    snapshots: &leasehold_gateway::SnapshotService,
    vault: &leasehold_adapters::vault::PgCredentialVault,
    (timeout, export_within): (std::time::Duration, chrono::TimeDelta),
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let kind = leasehold_adapters::dispatch::SnapshotDispatch::new(
        snapshots.clone(),
        (host_agents(timeout)?, timeout),
        vault.clone(),
    )
    .with_export_within(export_within);
    Ok(run_dispatcher(kind, snapshots.pipeline().store(), stopped))
}

/// Starts the VM inventory reconciler: each host's agent listed and squared with the log
/// (recovery lookups, orphans destroyed or dead-lettered).
///
/// # Errors
/// The host agents' HTTP client cannot be built.
pub fn start_vm_inventory(
    vms: &leasehold_gateway::VmService,
    vault: &leasehold_adapters::vault::PgCredentialVault,
    (timeout, every): (std::time::Duration, chrono::TimeDelta),
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let agents = host_agents(timeout)?;
    let policy = leasehold_adapters::vm_inventory::VmInventoryPolicy {
        sweep_every: every,
        ..Default::default()
    };
    let inventory = leasehold_adapters::vm_inventory::VmInventory::new(
        vms.clone(),
        (agents, vault.clone()),
        policy,
    );
    Ok(run(inventory, vms.pipeline().store(), stopped))
}

/// Starts the VM reaper: stuck and idle VMs struck, and destroyed on a second strike.
pub fn start_vm_reaper(
    vms: &leasehold_gateway::VmService,
    policy: leasehold_adapters::vm_reaper::VmReapPolicy,
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let store = vms.pipeline().store();
    let reaper = leasehold_adapters::vm_reaper::VmReaper::new(vms.clone(), store.clone(), policy);
    run(reaper, store, stopped)
}

/// The clients of the providers file's connections.
///
/// # Errors
/// A client cannot be built.
pub fn providers(
    configs: Vec<leasehold_adapters::providers::ProviderConfig>,
) -> anyhow::Result<leasehold_adapters::dispatch::Providers> {
    let clients: Result<Vec<_>, _> =
        configs.into_iter().map(leasehold_adapters::providers::ProviderClient::new).collect();
    Ok(leasehold_adapters::dispatch::Providers::new(clients.context("a provider's HTTP client")?))
}

/// Starts the rental dispatcher (provisions, stops, resumes and terminations sent to
/// `providers`) and the observer asking them for a look at each machine every `every`.
pub fn start_rental_dispatch(
    rentals: &leasehold_commands::rental_service::RentalService<PgEventStore>,
    providers: &leasehold_adapters::dispatch::Providers,
    every: chrono::TimeDelta,
    stopped: &watch::Receiver<bool>,
) -> [JoinHandle<()>; 2] {
    let store = rentals.pipeline().store();
    let kind =
        leasehold_adapters::dispatch::RentalDispatch::new(rentals.clone(), providers.clone());
    let observer = leasehold_adapters::rented::RentalObserver::new(
        rentals.clone(),
        providers.clone(),
        leasehold_adapters::PgReadModels::of(store),
        every,
    );
    [run_dispatcher(kind, store, stopped), run(observer, store, stopped)]
}

/// Starts the runner dispatcher (assigned runner leases launched on the nodes of `file`, in
/// its order, released and quarantined ones destroyed, with registrations from its issuer)
/// and the orphan sweep listing those nodes' instances every `every`.
///
/// # Errors
/// An agent's HTTP client cannot be built.
pub fn start_runner_dispatcher(
    rented: &leasehold_gateway::Rented,
    (file, every): (leasehold_adapters::runner_providers::RunnerNodesFile, chrono::TimeDelta),
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<[JoinHandle<()>; 2]> {
    use leasehold_adapters::runner_providers::{JitIssuer, RunnerProviderClient};
    let clients: Result<Vec<_>, _> =
        file.nodes.into_iter().map(RunnerProviderClient::new).collect();
    let issuer = JitIssuer::new(file.issuer).context("the issuer's HTTP client")?;
    let nodes = leasehold_adapters::dispatch::RunnerNodes::new(
        clients.context("a runner node's HTTP client")?,
        issuer,
    );
    let store = rented.runners.pipeline().store();
    let orphans = leasehold_adapters::runners::RunnerOrphans::new(
        rented.runners.clone(),
        nodes.clone(),
        every,
    );
    let kind = leasehold_adapters::dispatch::RunnerDispatch::new(rented.runners.clone(), nodes)
        .with_headroom(leasehold_adapters::PgReadModels::of(store));
    Ok([run_dispatcher(kind, store, stopped), run(orphans, store, stopped)])
}

/// Starts the launch reconciler: a launch unanswered for `answer_within` is recorded
/// indeterminate and its node asked for its reconciliation, looked at every `every`.
pub fn start_launch_reconciler(
    rented: &leasehold_gateway::Rented,
    (answer_within, every): (chrono::TimeDelta, chrono::TimeDelta),
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let store = rented.runs.pipeline().store();
    let reconciler = leasehold_adapters::rented::LaunchReconciler::new(
        (rented.runs.clone(), rented.nodes.clone()),
        leasehold_adapters::PgReadModels::of(store),
        (answer_within, every),
    );
    run(reconciler, store, stopped)
}

/// Starts the run dispatcher: each run's attempt started when its booking runs and its
/// rental's node is ready, its launch ordered on the node.
pub fn start_run_dispatcher(
    rented: &leasehold_gateway::Rented,
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let store = rented.runs.pipeline().store();
    let dispatcher =
        leasehold_adapters::rented::RunDispatcher::new((rented.runs.clone(), rented.nodes.clone()));
    run(dispatcher, store, stopped)
}

/// Starts the rented expiry sweep: nodes whose lease passed lost, rentals past their max
/// lifetime terminated, every `every`.
pub fn start_rented_expiry(
    rented: &leasehold_gateway::Rented,
    every: chrono::TimeDelta,
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let store = rented.nodes.pipeline().store();
    let expiry = leasehold_adapters::rented::RentedExpiry::new(
        (rented.nodes.clone(), rented.rentals.clone()),
        leasehold_adapters::PgReadModels::of(store),
        every,
    );
    run(expiry, store, stopped)
}

/// Starts the runner lease reconcilers: the `runner-reaper` (expired leases quarantined or
/// failed, sweeping every `every`) and `runner-inventory` (a node's re-registration moves its
/// leases to a new epoch; an inventory lacking a quarantined lease settles it).
pub fn start_runner_reconcilers(
    rented: &leasehold_gateway::Rented,
    every: chrono::TimeDelta,
    stopped: &watch::Receiver<bool>,
) -> [JoinHandle<()>; 2] {
    let store = rented.runners.pipeline().store();
    let read_models = leasehold_adapters::PgReadModels::of(store);
    let reaper = leasehold_adapters::runners::RunnerReaper::new(
        rented.runners.clone(),
        read_models.clone(),
        every,
    );
    let inventory =
        leasehold_adapters::runners::RunnerInventory::new(rented.runners.clone(), read_models);
    [run(reaper, store, stopped), run(inventory, store, stopped)]
}

/// Starts snapshot retention GC: snapshots past their retention deleted, each tenant's
/// layers past `layer_cap` evicted, and creations or restores stuck past `stuck_after` given
/// up on, sweeping every `every`.
pub fn start_snapshot_gc(
    snapshots: &leasehold_gateway::SnapshotService,
    (every, layer_cap, stuck_after): (chrono::TimeDelta, Option<usize>, chrono::TimeDelta),
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let store = snapshots.pipeline().store();
    let gc =
        leasehold_adapters::snapshot_gc::SnapshotGc::new(snapshots.clone(), store.clone(), every)
            .with_layer_cap(layer_cap)
            .with_stuck_after(Some(stuck_after));
    run(gc, store, stopped)
}

/// Starts the retention reaper, when the policy reaps anything.
pub fn start_reaper(
    pipeline: &CommandPipeline<PgEventStore>,
    placed_on: BackendName,
    settings: &Reconciling,
    stopped: &watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    if settings.retention_max_age.is_none() && settings.retention.per_tenant.is_none() {
        return None;
    }
    let store = pipeline.store();
    let reaper = RetentionReaper::new(
        service(pipeline, placed_on, settings),
        store.clone(),
        settings.retention,
    );
    Some(run(reaper, store, stopped))
}

/// Probes every backend every `every` until `stopped` turns true.
async fn probe(
    backends: Backends,
    store: PgEventStore,
    every: std::time::Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let status = PgBackendStatus::new(store);
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*stopped.borrow() {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stopped.changed() => return,
        }
        if let Err(error) = health::probe_all(&backends, &status, chrono::Utc::now()).await {
            tracing::warn!(%error, "recording backend health failed");
        }
    }
}
