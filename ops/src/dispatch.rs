//! The dispatchers `serve` runs: the lease backends' one, when a backends file says how to
//! reach them (`--backends-file`). Without it leases are recorded and never sent anywhere
//! (their backends report through the agent mutations and callbacks).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use leasehold_adapters::backends::{BackendClient, BackendConfig, config};
use leasehold_adapters::dispatch::{
    Backends, Backoff, CallbackUrls, Dispatcher, LeaseDispatch, PgOutbox,
};
use leasehold_adapters::{PgEventStore, PgProjectionStore};
use leasehold_commands::lease_service::LeaseService;
use leasehold_commands::{CommandPipeline, PipelineConfig, SystemClock};
use leasehold_domain::lease::BackendName;
use leasehold_projections::{ReconcilerConfig, ReconcilerRunner};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The backends the backends file names.
///
/// # Errors
/// The backends file cannot be used.
pub fn backends(backends_file: &Path) -> anyhow::Result<Vec<BackendConfig>> {
    config::load(backends_file).context("--backends-file")
}

/// Starts the lease dispatcher over `configs`; it stops when `stopped` turns true.
/// `callback_base` is the URL backends reach this gateway at.
///
/// # Errors
/// A backend's HTTP client cannot be built.
pub fn start(
    store: &PgEventStore,
    configs: Vec<BackendConfig>,
    (callback_base, placed_on): (&str, BackendName),
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<(Vec<String>, JoinHandle<()>)> {
    let clock = Arc::new(SystemClock);
    let mut clients = Vec::new();
    for config in configs {
        let name = config.name.clone();
        let client = BackendClient::new(config, clock.clone())
            .with_context(|| format!("the HTTP client of backend {name}"))?;
        clients.push(client);
    }
    let names = clients.iter().map(|client| client.name().to_string()).collect();
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    let service = LeaseService::new(pipeline, Some(placed_on), Default::default());
    let kind =
        LeaseDispatch::new(service, Backends::new(clients), CallbackUrls::new(callback_base));
    let dispatcher = Dispatcher::new(kind, PgOutbox::new(store.clone()), Backoff::default());
    let runner = ReconcilerRunner::new(
        dispatcher,
        PgProjectionStore::new(store.clone()),
        ReconcilerConfig::new(clock),
    );
    Ok((names, tokio::spawn(runner.run(stopped.clone()))))
}
