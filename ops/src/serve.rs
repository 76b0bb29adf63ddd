//! `leasehold serve`: migrate, then run the projectors until SIGINT or SIGTERM. (The GraphQL
//! gateway joins here next.) A stop lets the batch in progress commit or roll back whole, so
//! no checkpoint is lost and no event is applied twice.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use leasehold_adapters::{PgEventStore, StoreConfig};
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::{Projection, Runner, RunnerConfig};
use tokio::sync::watch;

use crate::cli::DatabaseArgs;
use crate::database;

/// How long a stop waits for the projectors to finish their batch.
const STOP_WAIT_SECONDS: u64 = 30;

/// How often the projectors' lag is logged.
const LAG_LOG_INTERVAL_SECONDS: u64 = 60;

/// Options of `leasehold serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Most events a projector applies in one transaction.
    #[arg(long, env = "LEASEHOLD_PROJECTION_BATCH", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    projection_batch: u64,
}

/// Runs until a stop signal.
pub async fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let url = args.database.parse()?;
    database::ensure_exists(&url).await?;
    let report = leasehold_adapters::migrate(&url).await?;
    if !report.applied.is_empty() {
        tracing::info!(applied = ?report.applied, "migrations applied");
    }
    let store = PgEventStore::new(&url, StoreConfig::default()).context("--database-url")?;
    let (stop, stopped) = watch::channel(false);
    let batch_events = usize::try_from(args.projection_batch).unwrap_or(1_000);
    let runner = Runner::new(
        LeaseProjection,
        store.clone(),
        RunnerConfig { batch_events, ..RunnerConfig::default() },
    );
    let projector = tokio::spawn(runner.run(stopped.clone()));
    let lag = tokio::spawn(log_lag(store.clone(), stopped));
    println!(
        "leasehold serve: {} at {}; projector {} running. Stop with Ctrl-C or SIGTERM.",
        url.database(),
        url.endpoint(),
        LeaseProjection::NAME
    );
    let signal = stop_signal().await?;
    tracing::info!(signal, "stopping");
    stop.send_replace(true);
    let finished = tokio::time::timeout(Duration::from_secs(STOP_WAIT_SECONDS), projector).await;
    lag.abort();
    finished.context("the projector did not stop in time")?.context("the projector failed")?;
    match store.checkpoint(LeaseProjection::NAME).await? {
        Some(cursor) => println!("stopped; {} checkpoint at {cursor}", LeaseProjection::NAME),
        None => println!("stopped; {} has applied nothing yet", LeaseProjection::NAME),
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM and names it.
async fn stop_signal() -> anyhow::Result<&'static str> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.map(|()| "SIGINT").context("listening for SIGINT"),
        _ = terminate.recv() => Ok("SIGTERM"),
    }
}

/// Logs each projection's lag and the horizon's, now and then.
async fn log_lag(store: PgEventStore, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(Duration::from_secs(LAG_LOG_INTERVAL_SECONDS));
    while !*stopped.borrow() {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stopped.changed() => return,
        }
        let horizon = store.horizon_lag_seconds().await.unwrap_or_default();
        match store.projection_status().await {
            Ok(statuses) => {
                for status in statuses {
                    tracing::info!(
                        projection = status.name,
                        events_behind = status.events_behind,
                        seconds_behind = status.seconds_behind,
                        horizon_lag_seconds = horizon,
                        "projection lag"
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "projection lag unavailable"),
        }
    }
}
