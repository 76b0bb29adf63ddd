//! `leasehold bench pipeline`: commands/s through the whole command pipeline at 1, 4 and 16
//! clients, beside one-row INSERT transactions at the same concurrency; and the lease
//! projection's catch-up over a log of lease events, beside a plain paged read of the same rows.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_commands::lease_input::{self, ItemInput, LeaseInputLimits, RequestLeaseInput};
use leasehold_commands::{CommandPipeline, CommandRequest, PipelineConfig};
use leasehold_domain::lease::{
    BackendName, HostName, Lease, LeaseCommand, LeaseEvent, LeaseFacts, LeaseId, LeaseItems,
    OperationId, PayloadHash, ProviderId,
};
use leasehold_domain::{
    Actor, DomainEvent, EventId, EventStore, EventType, ExpectedVersion, Metadata, NewEvent,
    OperationKey, StreamAppend, StreamType, TenantId,
};
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::{Projection, Runner, RunnerConfig};
use uuid::Uuid;

use super::log::{copy_log_to_raw, raw_read, raw_single};
use super::workload::RAW_TABLE_SQL;
use super::{BenchArgs, Measure, rate, report, run_for};

/// Options of `leasehold bench pipeline`.
#[derive(Debug, Clone, Args)]
pub struct PipelineBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// Lease events in the log the projection catches up on.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1_000..=10_000_000))]
    projection_events: u64,
}

const CLIENT_COUNTS: [usize; 3] = [1, 4, 16];
/// Lease events per lease in the projection's log: requested, provisioned, activated, a custom
/// domain, deprovision requested.
const EVENTS_PER_LEASE: u64 = 5;
/// Leases per append while filling the log.
const FILL_LEASES_PER_APPEND: u64 = 20;
const FILL_WRITERS: u64 = 4;

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &PipelineBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, args).await }).await
}

async fn measure_all(url: &DatabaseUrl, args: &PipelineBenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    url.connect().await?.batch_execute(RAW_TABLE_SQL).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 20, ..StoreConfig::default() })?;
    let (common, duration) = (&args.common, args.common.duration());
    for clients in CLIENT_COUNTS {
        let name = format!("commands_{clients}_clients");
        if !common.wants(&name) {
            continue;
        }
        common.progress(&format!("lease commands, {clients} clients"));
        let baseline = raw_single(url, clients, duration).await?;
        let value = commands(&store, clients, duration).await?;
        report(&Measure { name, value, unit: "commands/s", baseline }, common.json);
    }
    if common.wants("projection_catch_up") {
        common.progress(&format!("filling the log with {} lease events", args.projection_events));
        fill_leases(&store, args.projection_events).await?;
        copy_log_to_raw(url).await?;
        common.progress("lease projection catch-up");
        let baseline = raw_read(url).await?;
        let value = catch_up(&store).await?;
        let name = "projection_catch_up".into();
        report(&Measure { name, value, unit: "events/s", baseline }, common.json);
    }
    Ok(())
}

fn request(
    lease: LeaseId,
    key: String,
    command: LeaseCommand,
    facts: LeaseFacts,
) -> CommandRequest<Lease> {
    CommandRequest::new(
        TenantId::parse("bench").expect("a valid name"),
        Actor { subject: "bench".into(), role: "tenant".into() },
        lease.stream_id(),
        OperationKey::parse(key).expect("a valid name"),
        command,
        facts,
    )
}

fn backend() -> BackendName {
    BackendName::parse("backend", "docker-1").expect("a valid name")
}

/// The lifecycle each client drives, one lease after another: request (a stream no process
/// has seen: loaded from the database), provisioned, a custom domain, deprovision.
fn lifecycle(lease: LeaseId) -> anyhow::Result<[(LeaseCommand, LeaseFacts); 4]> {
    let input = RequestLeaseInput {
        provider_id: Uuid::nil().to_string(),
        items: vec![
            ItemInput {
                sku: "gpu.h100.1x".into(),
                quantity: 1,
                service_name: Some("trainer".into()),
            },
            ItemInput {
                sku: "cpu.standard.4x".into(),
                quantity: 2,
                service_name: Some("web".into()),
            },
        ],
        payload_hash: "9f".repeat(32),
    };
    // Each lease is provisioned once here: its id serves as the operation's.
    let operation = OperationId(lease.0);
    let limits = LeaseInputLimits::default();
    let provision = lease_input::request_provision(lease, operation, &input, limits)?;
    let domain = lease_input::set_custom_domain(Some("web"), Some("app.example.com"))?;
    let routed = LeaseFacts { backend: Some(backend()), ..LeaseFacts::default() };
    Ok([
        (provision, routed),
        (LeaseCommand::ReportProvisioned { operation }, LeaseFacts::default()),
        (domain, LeaseFacts::default()),
        (LeaseCommand::Deprovision, LeaseFacts::default()),
    ])
}

pub(super) async fn commands(
    store: &PgEventStore,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    run_for(clients, duration, |_, deadline| {
        let pipeline = pipeline.clone();
        async move {
            let mut done = 0u64;
            'leases: loop {
                let lease = LeaseId(Uuid::now_v7());
                for (step, (command, facts)) in lifecycle(lease)?.into_iter().enumerate() {
                    if Instant::now() >= deadline {
                        break 'leases;
                    }
                    let key = format!("{}-{step}", lease.0.simple());
                    pipeline
                        .execute(request(lease, key, command, facts))
                        .await
                        .context("a command")?;
                    done += 1;
                }
            }
            Ok(done)
        }
    })
    .await
}

/// The events of one lease's lifecycle, as the pipeline would write them.
fn lease_events(
    lease: LeaseId,
    at: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Vec<LeaseEvent>> {
    let [(LeaseCommand::RequestProvision { items, .. }, _), ..] = lifecycle(lease)? else {
        anyhow::bail!("the lifecycle starts with a request");
    };
    let items: LeaseItems = items;
    Ok(vec![
        LeaseEvent::LeaseProvisionRequested {
            lease,
            provider: ProviderId(Uuid::nil()),
            items,
            payload_hash: PayloadHash::parse("payloadHash", "9f".repeat(32))?,
            backend: backend(),
            generation: 1,
            release: 1,
            at,
            operation: Some(OperationId(lease.0)),
        },
        LeaseEvent::LeaseProvisioned { release: Some(1), at },
        LeaseEvent::LeaseActivated { at },
        LeaseEvent::LeaseCustomDomainSet {
            service: Some(leasehold_domain::lease::ServiceName::parse("service", "web")?),
            domain: Some(HostName::parse("domain", "app.example.com")?),
            at,
        },
        LeaseEvent::LeaseDeprovisionRequested { generation: 2, at },
    ])
}

fn stream_append(
    lease: LeaseId,
    at: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<StreamAppend> {
    let events = lease_events(lease, at)?
        .iter()
        .map(|event| {
            Ok(NewEvent {
                event_id: EventId::from_uuid(Uuid::now_v7()),
                event_type: EventType::parse(event.event_type())?,
                schema_version: 1,
                payload: event.to_payload(),
                metadata: Metadata::default(),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(StreamAppend {
        stream_id: lease.stream_id(),
        stream_type: StreamType::parse("lease")?,
        tenant_id: TenantId::parse("bench")?,
        expected: ExpectedVersion::NoStream,
        events,
    })
}

/// Appends whole lease lifecycles until the log holds at least `events` lease events.
pub(super) async fn fill_leases(store: &PgEventStore, events: u64) -> anyhow::Result<()> {
    let leases = events.div_ceil(EVENTS_PER_LEASE);
    let appends = leases.div_ceil(FILL_LEASES_PER_APPEND);
    let tasks: Vec<_> = (0..FILL_WRITERS)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                for _ in (writer..appends).step_by(usize::try_from(FILL_WRITERS)?) {
                    let at = chrono::Utc::now();
                    let append: Vec<StreamAppend> = (0..FILL_LEASES_PER_APPEND)
                        .map(|_| stream_append(LeaseId(Uuid::now_v7()), at))
                        .collect::<anyhow::Result<_>>()?;
                    store.append(append).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Runs the lease projection from an empty checkpoint until it has applied the whole log.
pub(super) async fn catch_up(store: &PgEventStore) -> anyhow::Result<f64> {
    let client = store.pool().get().await?;
    let row = client
        .query_one(
            "SELECT log_epoch, tx_id::text::bigint, position, count(*) OVER () FROM events \
             ORDER BY log_epoch DESC, tx_id DESC, position DESC LIMIT 1",
            &[],
        )
        .await?;
    let last = leasehold_domain::Cursor {
        log_epoch: u32::try_from(row.get::<_, i32>(0))?,
        tx_id: u64::try_from(row.get::<_, i64>(1))?,
        position: u64::try_from(row.get::<_, i64>(2))?,
    };
    let total = u64::try_from(row.get::<_, i64>(3))?;
    drop(client);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = Runner::new(
        LeaseProjection,
        leasehold_adapters::PgProjectionStore::new(store.clone()),
        RunnerConfig::default(),
    );
    let mut checkpoints = runner.checkpoints();
    let started = Instant::now();
    let task = tokio::spawn(runner.run(stopped));
    checkpoints
        .wait_for(|checkpoint| checkpoint.is_some_and(|checkpoint| checkpoint >= last))
        .await
        .context("the projector stopped before catching up")?;
    let elapsed = started.elapsed();
    stop.send_replace(true);
    task.await?;
    anyhow::ensure!(
        leasehold_adapters::PgReadModels::of(store).checkpoint(LeaseProjection::NAME).await?
            == Some(last),
        "the projector's stored checkpoint is not the last event"
    );
    Ok(rate(total, elapsed))
}
