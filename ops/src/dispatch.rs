//! The dispatchers `serve` runs: the lease backends' one, when a backends file says how to
//! reach them (`--backends-file`). Without it leases are recorded and never sent anywhere
//! (their backends report through the agent mutations and callbacks).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use leasehold_adapters::backends::{BackendClient, BackendConfig, config};
use leasehold_adapters::dispatch::{
    Backends, Backoff, CallbackUrls, Dispatcher, LeaseDispatch, ManifestVault, PgOutbox,
};
use leasehold_adapters::{PgEventStore, PgProjectionStore};
use leasehold_commands::lease_service::LeaseService;
use leasehold_commands::{CommandPipeline, PipelineConfig, SystemClock};
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

/// Starts the lease dispatcher over `backends`; it stops when `stopped` turns true.
/// `callback_base` is the URL backends reach this gateway at; leases without a router's
/// choice are placed on `placed_on`.
pub fn start(
    store: &PgEventStore,
    (backends, manifests): (Backends, ManifestVault),
    (callback_base, placed_on): (&str, BackendName),
    stopped: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    let service = LeaseService::new(pipeline, Some(placed_on), Default::default());
    let kind = LeaseDispatch::new(service, backends, CallbackUrls::new(callback_base))
        .with_manifests(manifests);
    let dispatcher = Dispatcher::new(kind, PgOutbox::new(store.clone()), Backoff::default());
    let runner = ReconcilerRunner::new(
        dispatcher,
        PgProjectionStore::new(store.clone()),
        ReconcilerConfig::new(Arc::new(SystemClock)),
    );
    tokio::spawn(runner.run(stopped.clone()))
}
