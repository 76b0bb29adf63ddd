//! `leasehold bench fleet`: VM creates per second through placement over 100 hosts at 16
//! clients, with the spread policy and with pack, and the rate of placements decided again
//! (a host's Reserve refusing what a stale catalog said) and of commands decided again (a race
//! lost on a host's version: another create took the host first); beside the lease request's
//! commands/s at 16 clients in the same run. The host projection runs beside the clients, so
//! placement's catalog lags the log as it does in `serve`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use leasehold_adapters::vault::PgCredentialVault;
use leasehold_adapters::{
    DatabaseUrl, PgEventStore, PgHostCatalog, PgProjectionStore, StoreConfig,
};
use leasehold_commands::host_service::{HostCaller, HostService};
use leasehold_commands::lease_input::{ItemInput, RequestLeaseInput};
use leasehold_commands::lease_service::{Caller, LeaseService};
use leasehold_commands::vm_input::{self, HostInput, VmInput};
use leasehold_commands::vm_service::VmService;
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::lease::{BackendName, LeaseId};
use leasehold_domain::vm::PlacementPolicy;
use leasehold_domain::{Actor, TenantId};
use leasehold_projections::host::HostProjection;
use leasehold_projections::{Runner, RunnerConfig};
use tokio::sync::watch;
use uuid::Uuid;

use super::{BenchArgs, Measure, report};

/// Options of `leasehold bench fleet`.
#[derive(Debug, Clone, Args)]
pub struct FleetBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// Hosts in the fleet.
    #[arg(long, default_value_t = 100)]
    hosts: usize,
}

const CLIENTS: usize = 16;

/// How long placement's picture of the fleet is kept, as in `serve`.
const CATALOG_MAX_AGE: Duration = leasehold_gateway::VM_CATALOG_MAX_AGE;

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &FleetBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, args).await }).await
}

async fn measure_all(url: &DatabaseUrl, args: &FleetBenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 32, ..StoreConfig::default() })?;
    let common = &args.common;
    let duration = common.duration();
    let mut figures = Vec::new();
    for (policy, name) in [(PlacementPolicy::Spread, "spread"), (PlacementPolicy::Pack, "pack")] {
        common.progress(&format!("VM creates, {name}, {} hosts, {CLIENTS} clients", args.hosts));
        let fleet = format!("{name}-");
        register_fleet(&store, &fleet, args.hosts).await?;
        figures.push((name, creates(&store, policy, &fleet, duration).await?));
    }
    common.progress(&format!("lease requests, {CLIENTS} clients (the baseline)"));
    let baseline = requests(&store, duration).await?;
    for (name, (rate, replaced, lost)) in figures {
        let measure = Measure {
            name: format!("vm_creates_{name}_{CLIENTS}_clients"),
            value: rate,
            unit: "creates/s",
            baseline,
        };
        report(&measure, common.json);
        let retries = Measure {
            name: format!("vm_create_retries_{name}"),
            value: replaced + lost,
            unit: "retries per create (baseline: placed again)",
            baseline: replaced,
        };
        report(&retries, common.json);
    }
    Ok(())
}

/// Registers `hosts` hosts named `{prefix}N`, each with room for far more VMs than a run
/// creates.
pub(super) async fn register_fleet(
    store: &PgEventStore,
    prefix: &str,
    hosts: usize,
) -> anyhow::Result<()> {
    let service = HostService::new(CommandPipeline::new(store.clone(), PipelineConfig::default()));
    let caller = HostCaller {
        actor: Actor { subject: "bench".into(), role: "operator".into() },
        namespace: None,
    };
    for n in 0..hosts {
        let input = HostInput {
            host_id: format!("{prefix}{n}"),
            url: "http://127.0.0.1:9".into(),
            cpus: 4_096,
            ram_mb: 16 * 1024 * 1024,
            storage_gb: 1_000_000,
            vm_count: 100_000,
            ..HostInput::default()
        };
        let (host, spec) = vm_input::host(&input).map_err(|error| anyhow::anyhow!("{error}"))?;
        service.register(&caller, &format!("register-{prefix}{n}"), &host, spec).await?;
    }
    Ok(())
}

/// Creates per second, and per create the placements decided again (a host's Reserve
/// refused what the catalog said) and the commands decided again (a race lost on a host's
/// version, or a stale belief).
async fn creates(
    store: &PgEventStore,
    policy: PlacementPolicy,
    fleet: &str,
    duration: Duration,
) -> anyhow::Result<(f64, f64, f64)> {
    // The host projection runs beside the clients: the catalog lags as in `serve`.
    let (stop, stopped) = watch::channel(false);
    let runner =
        Runner::new(HostProjection, PgProjectionStore::new(store.clone()), RunnerConfig::default());
    let mut checkpoints = runner.checkpoints();
    let projector = tokio::spawn(runner.run(stopped));
    let head = leasehold_domain::EventStore::head(store).await?;
    let caught_up = checkpoints.wait_for(|at| at.is_some_and(|at| at >= head));
    tokio::time::timeout(Duration::from_secs(60), caught_up)
        .await
        .context("the host projection")??;
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    let ports = (
        PgHostCatalog::new(store.clone()),
        PgCredentialVault::new(store.clone(), b"bench-vm-credentials-key-0123456789abcdef"),
    );
    let vms = VmService::new(pipeline, ports, policy).with_catalog_max_age(CATALOG_MAX_AGE);
    let replaced = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (vms, fleet) = (vms.clone(), fleet.to_owned());
            let (replaced, refused) = (Arc::clone(&replaced), Arc::clone(&refused));
            tokio::spawn(async move {
                let caller = tenant(client);
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let task = format!("{fleet}{client}-{done}");
                    let input = VmInput {
                        task_id: task.clone(),
                        cpus: 2,
                        ram_mb: 2_048,
                        storage_gb: 10,
                        ..VmInput::default()
                    };
                    let (task, spec) =
                        vm_input::vm(&input).map_err(|error| anyhow::anyhow!("{error}"))?;
                    let key = task.to_string();
                    match vms.create(&caller, &key, (&task, spec), &BTreeMap::new()).await {
                        Ok(created) => {
                            replaced.fetch_add(u64::from(created.replacements), Ordering::Relaxed);
                            done += 1;
                        }
                        // A create that kept losing races (pack: every one wants the same
                        // host) is counted, not fatal.
                        Err(error) => {
                            tracing::debug!(%error, "a create was refused");
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for client in clients {
        total += client.await.context("a client")??;
    }
    let elapsed = started.elapsed();
    stop.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(30), projector).await;
    let lost = vms.pipeline().decided_again();
    let refused = refused.load(Ordering::Relaxed);
    if refused > 0 {
        eprintln!("{refused} creates refused after every retry (of {})", total + refused);
    }
    let per_create = |count: u64| count as f64 / total.max(1) as f64;
    Ok((
        super::rate(total, elapsed),
        per_create(replaced.load(Ordering::Relaxed)),
        per_create(lost),
    ))
}

fn tenant(client: usize) -> Caller {
    Caller {
        actor: Actor { subject: format!("bench-{client}"), role: "tenant".into() },
        tenant: Some(TenantId::parse(format!("bench-{}", client % 4)).expect("a valid name")),
        provider: None,
        namespace: None,
    }
}

/// Lease requests per second at 16 clients (each a new lease).
pub(super) async fn requests(store: &PgEventStore, duration: Duration) -> anyhow::Result<f64> {
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    let backend = BackendName::parse("backend", "local").expect("a valid name");
    let service = LeaseService::new(pipeline, Some(backend), Default::default());
    let input = RequestLeaseInput {
        provider_id: Uuid::nil().to_string(),
        items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 1, service_name: None }],
        payload_hash: "9f".repeat(32),
    };
    super::run_for(CLIENTS, duration, |client, deadline| {
        let (service, input) = (service.clone(), input.clone());
        async move {
            let caller = tenant(client);
            let mut done = 0u64;
            while Instant::now() < deadline {
                let lease = LeaseId(Uuid::now_v7());
                service
                    .request(&caller, &format!("r-{}", lease.0.simple()), Some(lease), &input)
                    .await?;
                done += 1;
            }
            Ok(done)
        }
    })
    .await
}
