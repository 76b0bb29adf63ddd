//! `leasehold bench snapshots`: snapshot creates per second through the snapshot service at
//! 16 clients, every create one append of the snapshot's request and its reservation on the
//! tenant's quota stream (expected versions on both): for one tenant, whose 16 clients all
//! contend for its one quota stream, and for 16 tenants, one client each; with the commands
//! decided again per create (races lost on the quota stream), beside the lease request's
//! commands/s at 16 clients in the same run. The listing facts a create reads (the VM's last
//! live snapshot) come from the snapshot read model, as in `serve`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use leasehold_adapters::{DatabaseUrl, PgEventStore, PgReadModels, StoreConfig};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::snapshot_service::{CreateSnapshot, SnapshotConfig, SnapshotService};
use leasehold_commands::vm_input::{self, VmInput};
use leasehold_commands::vm_service::{StreamCatalog, VmService};
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::quota::QuotaLimits;
use leasehold_domain::snapshot::{RequestedKind, SnapshotMode};
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::vm::{PlacementPolicy, VmUrl};
use leasehold_domain::{Actor, TenantId};

use super::{BenchArgs, Measure, report};

/// Options of `leasehold bench snapshots`.
#[derive(Debug, Clone, Args)]
pub struct SnapshotBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
}

const CLIENTS: usize = 16;

type Snapshots = SnapshotService<PgEventStore, PgReadModels>;

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &SnapshotBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, &args.common).await }).await
}

async fn measure_all(url: &DatabaseUrl, common: &BenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 32, ..StoreConfig::default() })?;
    let duration = common.duration();
    super::fleet::register_fleet(&store, "snap-", 1).await?;
    let vms = running_vms(&store).await?;
    let pipeline = CommandPipeline::new(
        store.clone(),
        // Sixteen clients on one quota stream: a create may lose many races in a row.
        PipelineConfig { retries_max: 64, ..PipelineConfig::default() },
    );
    let snapshots =
        SnapshotService::new(pipeline, PgReadModels::of(&store), SnapshotConfig::default());
    let mut figures = Vec::new();
    for (tenants, name) in [(1, "1_tenant"), (CLIENTS, "16_tenants")] {
        common.progress(&format!("snapshot creates, {tenants} tenants, {CLIENTS} clients"));
        let before = snapshots.pipeline().decided_again();
        let (rate, total) = creates(&snapshots, (name, &vms[..tenants]), duration).await?;
        let again = snapshots.pipeline().decided_again() - before;
        figures.push((name, rate, again as f64 / total.max(1) as f64));
    }
    common.progress(&format!("lease requests, {CLIENTS} clients (the baseline)"));
    let baseline = super::fleet::requests(&store, duration).await?;
    for (name, rate, again) in figures {
        let measure = Measure {
            name: format!("snapshot_creates_{name}_{CLIENTS}_clients"),
            value: rate,
            unit: "creates/s",
            baseline,
        };
        report(&measure, common.json);
        let retries = Measure {
            name: format!("snapshot_create_retries_{name}"),
            value: again,
            unit: "decided again per create (baseline: none)",
            baseline: 0.0,
        };
        report(&retries, common.json);
    }
    Ok(())
}

fn tenant_of(n: usize) -> anyhow::Result<TenantId> {
    TenantId::parse(format!("snap-bench-{n}")).map_err(|error| anyhow::anyhow!("{error}"))
}

fn caller(tenant: TenantId, client: usize) -> Caller {
    Caller {
        actor: Actor { subject: format!("bench-{client}"), role: "tenant".into() },
        tenant: Some(tenant),
        provider: None,
        namespace: None,
    }
}

/// One running VM for each of 16 tenants, on the one host (booted as its agent would
/// report), each tenant's quota limits set far above what a run creates (so the quota is
/// checked on every create, never refused).
async fn running_vms(store: &PgEventStore) -> anyhow::Result<Vec<(TenantId, VmId)>> {
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    let host = HostId::parse("host", "snap-0").map_err(|error| anyhow::anyhow!("{error}"))?;
    let catalog = StreamCatalog::new(pipeline.clone(), vec![host.clone()]);
    let vault = leasehold_adapters::vault::PgCredentialVault::new(
        store.clone(),
        b"bench-vm-credentials-key-0123456789abcdef",
    );
    let vms = VmService::new(pipeline.clone(), (catalog, vault), PlacementPolicy::Spread);
    let snapshots =
        SnapshotService::new(pipeline, PgReadModels::of(store), SnapshotConfig::default());
    let agent = Caller {
        actor: Actor { subject: "bench-agent".into(), role: "agent".into() },
        tenant: None,
        provider: None,
        namespace: None,
    };
    let limits = QuotaLimits { max_count: 1_000_000_000, max_bytes: 0 };
    let mut running = Vec::with_capacity(CLIENTS);
    for n in 0..CLIENTS {
        let tenant = tenant_of(n)?;
        let owner = caller(tenant.clone(), n);
        let input = VmInput {
            task_id: format!("snap-bench-{n}"),
            cpus: 1,
            ram_mb: 512,
            storage_gb: 1,
            ..VmInput::default()
        };
        let (task, spec) = vm_input::vm(&input).map_err(|error| anyhow::anyhow!("{error}"))?;
        let created =
            vms.create(&owner, &format!("c-{n}"), (&task, spec), &Default::default()).await?;
        let (_, stored) = vms.owned(created.vm).await?;
        let boot = stored.operation.context("a boot")?;
        let url = VmUrl::parse("url", "127.0.0.1:9").map_err(|error| anyhow::anyhow!("{error}"))?;
        vms.report_booted(&agent, &host, &format!("b-{n}"), created.vm, (boot, url)).await?;
        let operator = Caller { tenant: None, ..caller(tenant.clone(), n) };
        snapshots.set_limits(&operator, &format!("q-{n}"), (&tenant, limits)).await?;
        running.push((tenant, created.vm));
    }
    Ok(running)
}

/// Snapshot creates per second at 16 clients spread over `vms`' tenants (client `c` on
/// tenant `c % tenants`) in the run named `run`, and how many were created.
async fn creates(
    snapshots: &Snapshots,
    (run, vms): (&str, &[(TenantId, VmId)]),
    duration: Duration,
) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let deadline = started + duration;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (tenant, vm) = vms[client % vms.len()].clone();
            let snapshots = snapshots.clone();
            let run = run.to_owned();
            tokio::spawn(async move {
                let owner = caller(tenant, client);
                let ask = CreateSnapshot {
                    vm,
                    requested: RequestedKind::Disk,
                    mode: SnapshotMode::Manual,
                    parent: None,
                    layer_key: None,
                    name: None,
                    retention_until: None,
                };
                let mut done = 0u64;
                while Instant::now() < deadline {
                    // Named by the run too: a key of the other run would be a retry.
                    let key = format!("s-{run}-{client}-{done}");
                    snapshots.create(&owner, &key, &ask).await?;
                    done += 1;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for client in clients {
        total += client.await.context("a client")??;
    }
    Ok((super::rate(total, started.elapsed()), total))
}
