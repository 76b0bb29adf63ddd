//! `leasehold bench gateway`: the GraphQL gateway under load, each figure beside a raw
//! PostgreSQL baseline taken in the same run:
//! - `leases_page_*`: a page of 50 leases with a status filter, over HTTP, at 1,000,000 leases,
//!   beside the same keyset SELECT sent straight to PostgreSQL;
//! - `workloads_page_*`: a page of 50 workloads filtered by kind and state, over HTTP, at
//!   1,000,000 workloads across the five kinds, beside the same keyset SELECT;
//! - `delivery_*`: commit-to-delivery latency with 1,000 subscriptions on one gateway while
//!   writers append, beside LISTEN/NOTIFY's commit-to-notification latency; gaps and
//!   duplicates are counted (both must be 0).

mod delivery;
mod pages;

use std::time::Duration;

use chrono::TimeDelta;
use clap::Args;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_domain::TenantId;
use leasehold_gateway::{AppState, GatewayConfig, JwtSecret, ProjectionProgress, Role};
use tokio::sync::watch;

use super::{BenchArgs, Measure, report};

/// Options of `leasehold bench gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// Leases in the read model the page queries run against.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=10_000_000))]
    leases: u64,
    /// Workloads (of the five kinds) in the read model the workloads page runs against.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=10_000_000))]
    workloads: u64,
    /// Concurrent subscriptions.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    subscriptions: u64,
    /// Subscriptions each WebSocket carries (the last socket may carry fewer). Above about
    /// 9,000 sockets the process runs out of file descriptors (client and server ends are
    /// both in it): carry 10,000 subscriptions on 1,000 sockets with 10.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    subscriptions_per_socket: u64,
    /// Events appended per second while the subscriptions listen.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    events_per_second: u64,
}

/// The tenant every benchmark request is made for.
const TENANT: &str = "bench";

/// The secret of the benchmark's gateway (it never leaves the process).
const SECRET: &[u8] = b"leasehold-bench-secret-0123456789abcdef";

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &GatewayBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, args).await }).await
}

/// A gateway running in this process, on a free port.
struct Gateway {
    base: String,
    token: String,
    store: PgEventStore,
    stop: watch::Sender<bool>,
}

impl Gateway {
    async fn start(url: &DatabaseUrl) -> anyhow::Result<Gateway> {
        let store =
            PgEventStore::new(url, StoreConfig { pool_size: 20, ..StoreConfig::default() })?;
        let progress = ProjectionProgress::new().polled("lease_views");
        let backend = leasehold_domain::lease::BackendName::parse("backend", "local")?;
        let config = GatewayConfig { backend: Some(backend), ..GatewayConfig::default() };
        let state = AppState::new(store.clone(), SECRET, config, progress)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, mut stopped) = watch::channel(false);
        let shutdown = async move {
            let _ = stopped.wait_for(|stopped| *stopped).await.map(|_| ());
        };
        tokio::spawn(leasehold_gateway::serve(listener, state, shutdown));
        let tenant = TenantId::parse(TENANT)?;
        let token = JwtSecret::new(SECRET)?.mint_for(
            "bench-user",
            Role::Tenant,
            Some(&tenant),
            None,
            TimeDelta::hours(2),
        );
        Ok(Gateway { base, token, store, stop })
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

async fn measure_all(url: &DatabaseUrl, args: &GatewayBenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    let gateway = Gateway::start(url).await?;
    let common = &args.common;
    if common.wants("leases_page") {
        common.progress(&format!("filling {} leases", args.leases));
        pages::fill(url, args.leases).await?;
        common.progress("pages of 50 leases with a status filter");
        for measure in pages::measure(url, &gateway, (&pages::LEASES, common.duration())).await? {
            report(&measure, common.json);
        }
    }
    if common.wants("workloads_page") {
        common.progress(&format!("filling {} workloads of five kinds", args.workloads));
        pages::fill_workloads(url, args.workloads).await?;
        common.progress("pages of 50 workloads filtered by kind and state");
        let walk = (&pages::WORKLOADS, common.duration());
        for measure in pages::measure(url, &gateway, walk).await? {
            report(&measure, common.json);
        }
    }
    if common.wants("delivery") {
        let (count, per) = (args.subscriptions, args.subscriptions_per_socket);
        common.progress(&format!("{count} subscriptions, {per} a socket, while writers append"));
        let load = delivery::Load {
            subscriptions: usize::try_from(args.subscriptions)?,
            per_socket: usize::try_from(args.subscriptions_per_socket)?,
            events_per_second: args.events_per_second,
            duration: common.duration(),
        };
        for measure in delivery::measure(url, &gateway, &load).await? {
            report(&measure, common.json);
        }
    }
    Ok(())
}

/// The `q`-quantile of sorted `samples`, in milliseconds.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// p50 and p99 of `value` beside those of `baseline`, named `prefix_p50_ms` and `prefix_p99_ms`.
fn latency_measures(
    prefix: &str,
    mut value: Vec<Duration>,
    mut baseline: Vec<Duration>,
) -> Vec<Measure> {
    value.sort();
    baseline.sort();
    [(0.5, "p50"), (0.99, "p99")]
        .into_iter()
        .map(|(q, label)| Measure {
            name: format!("{prefix}_{label}_ms"),
            value: quantile_ms(&value, q),
            unit: "ms",
            baseline: quantile_ms(&baseline, q),
        })
        .collect()
}
