//! `leasehold bench nodes`: node heartbeats accepted per second at 1,000 enrolled nodes,
//! every heartbeat a fenced command through the node service (its fencing token checked on
//! the node's stream), at 16 clients, beside the lease request's commands/s in the same run.
//!
//! Two measures, for the design question the issue asks: **recorded periodically** (the
//! choice: a heartbeat is recorded as an event when the node's last recorded one is 30 s old
//! or its facts changed, and every beat in between is checked and changes nothing), and
//! **every beat an event** (the alternative, forced by a clock that moves 31 s per command).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, TimeDelta, Utc};
use clap::Args;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_commands::enrollment::{EnrollmentKey, NodeSession, node_of};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::node_service::{NodeService, Presented};
use leasehold_commands::rental_service::{
    Connections, ProvisionRental, RentalConfig, RentalService,
};
use leasehold_commands::{CommandPipeline, PipelineConfig, SystemClock};
use leasehold_domain::node::{AgentVersion, FactText, NodeFacts};
use leasehold_domain::rental::{
    CapacitySupport, ConnectionId, IdempotentProvision, OfferId, Resources,
};
use leasehold_domain::{Actor, Clock, TenantId};

use super::{BenchArgs, Measure, report};

/// Options of `leasehold bench nodes`.
#[derive(Debug, Clone, Args)]
pub struct NodeBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// Nodes enrolled before the heartbeats start.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(16..=100_000))]
    nodes: u64,
}

const CLIENTS: usize = 16;
const KEY: &[u8] = b"bench enrollment key, 32 bytes or more";

/// A clock that moves 31 s every time it is read: every heartbeat is then past the 30 s
/// after its node's last recorded one, so every beat is recorded.
#[derive(Debug)]
struct Hurried {
    start: DateTime<Utc>,
    reads: AtomicI64,
}

impl Clock for Hurried {
    fn now(&self) -> DateTime<Utc> {
        self.start + TimeDelta::seconds(31 * self.reads.fetch_add(1, Ordering::Relaxed))
    }
}

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &NodeBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, args).await }).await
}

async fn measure_all(url: &DatabaseUrl, args: &NodeBenchArgs) -> anyhow::Result<()> {
    let common = &args.common;
    leasehold_adapters::migrate(url).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 32, ..StoreConfig::default() })?;
    let duration = common.duration();
    common.progress(&format!("enrolling {} nodes", args.nodes));
    let sessions = enrolled(&store, args.nodes).await?;
    let key = EnrollmentKey::new(KEY).map_err(|error| anyhow::anyhow!("{error}"))?;
    let periodic = NodeService::new(pipeline(&store, Arc::new(SystemClock)), key.clone());
    common.progress("heartbeats, recorded every 30 s per node");
    let recorded_periodically = heartbeats(&periodic, &sessions, ("periodic", duration)).await?;
    let hurried =
        Arc::new(Hurried { start: Utc::now() + TimeDelta::hours(1), reads: AtomicI64::new(0) });
    let every = NodeService::new(pipeline(&store, hurried), key);
    common.progress("heartbeats, every one recorded");
    let recorded_every_time = heartbeats(&every, &sessions, ("every", duration)).await?;
    common.progress(&format!("lease requests, {CLIENTS} clients (the baseline)"));
    let baseline = super::fleet::requests(&store, duration).await?;
    for (name, value) in [
        ("node_heartbeats_recorded_every_30s", recorded_periodically),
        ("node_heartbeats_every_one_an_event", recorded_every_time),
    ] {
        let measure = Measure {
            name: format!("{name}_{}_nodes_{CLIENTS}_clients", args.nodes),
            value,
            unit: "heartbeats/s",
            baseline,
        };
        report(&measure, common.json);
    }
    Ok(())
}

fn pipeline(store: &PgEventStore, clock: Arc<dyn Clock>) -> CommandPipeline<PgEventStore> {
    CommandPipeline::new(store.clone(), PipelineConfig::default()).with_clock(clock)
}

fn facts() -> anyhow::Result<NodeFacts> {
    let text =
        |value: &str| FactText::parse("fact", value).map_err(|error| anyhow::anyhow!("{error}"));
    Ok(NodeFacts {
        observed_at: Utc::now(),
        os: text("linux")?,
        architecture: text("amd64")?,
        container_runtime: text("docker")?,
        cpu_millis: 4_000,
        memory_bytes: 16 << 30,
        disk_free_bytes: None,
        images: Vec::new(),
    })
}

/// `count` rentals provisioned (each inviting its node) and their nodes enrolled, 16 at a
/// time; the sessions their enrollments gave.
async fn enrolled(store: &PgEventStore, count: u64) -> anyhow::Result<Vec<NodeSession>> {
    let connection =
        ConnectionId::parse("connection", "bench").map_err(|error| anyhow::anyhow!("{error}"))?;
    let mut connections = Connections::default();
    let support = CapacitySupport {
        stop: true,
        resume: true,
        persistent_disk: false,
        spot: false,
        exact_pricing: true,
        idempotent_provision: IdempotentProvision::OperationKey,
        list_owned: true,
        observe_after_terminate: false,
    };
    connections.register(connection.clone(), support)?;
    let key = EnrollmentKey::new(KEY).map_err(|error| anyhow::anyhow!("{error}"))?;
    let config = RentalConfig {
        connections,
        control_plane_url: "http://127.0.0.1".into(),
        agent_version: "1.0.0".into(),
        key: key.clone(),
    };
    let rentals = RentalService::new(pipeline(store, Arc::new(SystemClock)), config);
    let nodes = NodeService::new(pipeline(store, Arc::new(SystemClock)), key.clone());
    let tenant = TenantId::parse("node-bench").map_err(|error| anyhow::anyhow!("{error}"))?;
    let owner = Caller {
        actor: Actor { subject: "bench".into(), role: "tenant".into() },
        tenant: Some(tenant),
        provider: None,
        namespace: None,
    };
    let ask = ProvisionRental {
        connection,
        offer: OfferId::parse("offer", "bench").map_err(|error| anyhow::anyhow!("{error}"))?,
        resources: Resources { cpu_millis: 4_000, memory_mb: 16_384, disk_gb: 10, gpus: 0 },
        interruptible: false,
        max_lifetime_seconds: 86_400,
    };
    let version =
        AgentVersion::parse("agent", "1.0.0").map_err(|error| anyhow::anyhow!("{error}"))?;
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|client| {
            let (rentals, nodes, owner, ask, key, version) = (
                rentals.clone(),
                nodes.clone(),
                owner.clone(),
                ask.clone(),
                key.clone(),
                version.clone(),
            );
            tokio::spawn(async move {
                let mut sessions = Vec::new();
                for n in (client..count).step_by(CLIENTS) {
                    let rental =
                        rentals.provision(&owner, &format!("rental-{n}"), &ask).await?.rental;
                    let node = node_of(rental, 1);
                    let token = key.enrollment_token(node);
                    let presented = Presented::Token { token: &token, rental, generation: 1 };
                    let enrollment =
                        nodes.enroll(node, presented, (version.clone(), facts()?)).await?;
                    sessions.push(key.verify(&enrollment.credential)?);
                }
                anyhow::Ok(sessions)
            })
        })
        .collect();
    let mut sessions = Vec::new();
    for client in clients {
        sessions.extend(client.await.context("a client")??);
    }
    Ok(sessions)
}

/// Heartbeats per second at 16 clients, client `c` beating the nodes `c, c + 16, …` in turn.
async fn heartbeats(
    nodes: &NodeService<PgEventStore>,
    sessions: &[NodeSession],
    (run, duration): (&str, Duration),
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let deadline = started + duration;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let nodes = nodes.clone();
            let mine: Vec<NodeSession> =
                sessions.iter().skip(client).step_by(CLIENTS).copied().collect();
            let run = run.to_owned();
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let session = &mine[usize::try_from(done).unwrap_or(0) % mine.len()];
                    nodes.heartbeat(session, &format!("beat-{run}-{client}-{done}"), None).await?;
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
    Ok(super::rate(total, started.elapsed()))
}
