//! `leasehold serve`: migrate, then run the projectors, the sealer and the GraphQL gateway
//! until SIGINT or SIGTERM. A stop lets requests in flight finish and the projector's batch commit or roll
//! back whole, so no checkpoint is lost and no event is applied twice.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::TimeDelta;
use clap::Args;
use leasehold_adapters::{DatabaseUrl, PgEventStore, PgReadModels, StoreConfig};
use leasehold_domain::TenantId;
use leasehold_domain::lease::BackendName;
use leasehold_gateway::{AppState, GatewayConfig, JwtSecret, Role};
use leasehold_projections::RunnerConfig;
use tokio::sync::watch;

use crate::secrets::SecretArgs;
use crate::{cluster, database};

/// How long one exchange with a host agent may take: fuse's agent answers a boot once the VM
/// booted, within its own 60-second request timeout.
const HOST_AGENT_TIMEOUT_SECONDS: u64 = 90;

/// How long a stop waits for the projectors and the gateway to finish.
const STOP_WAIT_SECONDS: u64 = 30;

/// How often the projectors' lag is logged.
const LAG_LOG_INTERVAL_SECONDS: u64 = 60;

/// The demo tenant the no-set-up start prints a token for, and `--demo` seeds.
pub(crate) const DEMO_TENANT: &str = "demo";

/// Options of `leasehold serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// PostgreSQL URL, e.g. postgres://user@host:5432/leasehold. Without it: the local server
    /// at 127.0.0.1:5432 (database `leasehold`, created if missing), else a private cluster
    /// started from this machine's PostgreSQL binaries under the data directory.
    #[arg(long, env = "LEASEHOLD_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Address the gateway listens on (port 0: any free port, printed at start).
    #[arg(long, env = "LEASEHOLD_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    secret: SecretArgs,
    /// The backend lease requests are placed on.
    #[arg(long, env = "LEASEHOLD_BACKEND", default_value = "local")]
    backend: String,
    /// Most events a projector applies in one transaction.
    #[arg(long, env = "LEASEHOLD_PROJECTION_BATCH", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    projection_batch: u64,
    /// A projection whose stored read models were built by another version of its code is
    /// rebuilt at start beside them (they keep serving) and switched in when caught up; with
    /// `false` its runner stops at the mismatch until `leasehold projections rebuild` is run.
    #[arg(long, env = "LEASEHOLD_REBUILD_ON_VERSION_CHANGE", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "true|false")]
    rebuild_on_version_change: bool,
    /// Longest a read-your-writes query waits for the projections, in milliseconds.
    #[arg(long, env = "LEASEHOLD_CONSISTENCY_WAIT_MS", default_value_t = 5_000)]
    consistency_wait_ms: u64,
    /// How long a WebSocket may take to send connection_init, in milliseconds (then 4408).
    #[arg(long, env = "LEASEHOLD_WS_INIT_TIMEOUT_MS", default_value_t = 3_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    ws_init_timeout_ms: u64,
    /// How often idle WebSockets are pinged, in milliseconds.
    #[arg(long, env = "LEASEHOLD_WS_PING_INTERVAL_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    ws_ping_interval_ms: u64,
    /// How long one message may take to reach a WebSocket client before its socket is closed
    /// (1013) and it must resume from its last cursor, in milliseconds.
    #[arg(long, env = "LEASEHOLD_WS_SEND_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    ws_send_timeout_ms: u64,
    /// Events per seal: the sealer writes a digest over every this many committed events, and
    /// over the rest at shutdown (`leasehold events verify` checks them).
    #[arg(long, env = "LEASEHOLD_SEAL_EVERY", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    seal_every: u64,
    /// Also publish the committed log to Kafka on these brokers, as `leasehold relay` does
    /// (restarted after a failure, waiting longer each time, up to a minute).
    #[arg(long, value_name = "HOST:PORT[,...]", env = "LEASEHOLD_RELAY_KAFKA_BROKERS")]
    relay_kafka_brokers: Option<String>,
    /// The topic the relay publishes to (it must exist).
    #[arg(long, default_value = "leasehold.events", env = "LEASEHOLD_RELAY_TOPIC")]
    relay_topic: String,
    /// librdkafka settings of your own for the relay's cluster (TLS, SASL, ...), one
    /// `key=value` a line, as `leasehold relay --kafka-config` takes them.
    #[arg(long, value_name = "FILE", env = "LEASEHOLD_RELAY_KAFKA_CONFIG")]
    relay_kafka_config: Option<std::path::PathBuf>,
    /// A JSON file saying how to reach each lease backend (name, url, secret_file,
    /// timeout_seconds; see the README). With it, `serve` sends every lease's work to its
    /// backend, signed with that backend's secret, and backends call back per operation.
    /// Without it, leases are recorded only.
    #[arg(long, env = "LEASEHOLD_BACKENDS_FILE")]
    backends_file: Option<std::path::PathBuf>,
    /// A demo with nothing set up: simulate every outside system inside this process (a lease
    /// backend, `demo-sim`, that every lease goes to; two hosts' agents; a rental provider
    /// whose machines run node agents; a runner node), seed a few workloads of each kind for
    /// the tenant `demo`, and keep a slow stream of lifecycle events going (a step every 3 s),
    /// so the dashboard has something to show. Off by default. Not with the files that name
    /// real backends, providers or runner nodes.
    #[arg(long, conflicts_with_all = ["backends_file", "providers_file", "runner_nodes_file"])]
    demo: bool,
    /// The URL backends reach this gateway's callbacks at (default: http://<listen address>).
    #[arg(long, env = "LEASEHOLD_CALLBACK_BASE_URL")]
    callback_base_url: Option<String>,
    /// How often each backend's complete inventory is read and compared with the log
    /// (orphans reported, failure budgets recorded, reaped data confirmed): a number and a
    /// unit, s, m, h or d.
    #[arg(long, env = "LEASEHOLD_INVENTORY_EVERY", default_value = "60s",
          value_parser = crate::token::parse_ttl)]
    inventory_every: TimeDelta,
    /// How often each backend's health and load are probed (the `backends` query).
    #[arg(long, env = "LEASEHOLD_HEALTH_EVERY", default_value = "10s",
          value_parser = crate::token::parse_ttl)]
    health_every: TimeDelta,
    /// How long a released lease's data is kept after the lease was created (its
    /// `retained_until`); then the retention reaper reaps it and it can no longer be
    /// restored. Default: no deadline.
    #[arg(long, env = "LEASEHOLD_RETENTION_MAX_AGE", value_parser = crate::token::parse_ttl)]
    retention_max_age: Option<TimeDelta>,
    /// Most retained leases a tenant keeps: beyond it, the oldest are reaped. Default: no cap.
    #[arg(long, env = "LEASEHOLD_RETAINED_PER_TENANT")]
    retained_per_tenant: Option<u32>,
    /// How long a backend has to call back after taking a provision, restore, restart or
    /// update; past it the work fails (`CallbackTimeout`), as fred's control plane does.
    #[arg(long, env = "LEASEHOLD_CALLBACK_DEADLINE", default_value = "10m",
          value_parser = crate::token::parse_ttl)]
    callback_deadline: TimeDelta,
    /// How often the retention reaper looks for records to reap (besides each deadline).
    #[arg(long, env = "LEASEHOLD_REAP_EVERY", default_value = "60s",
          value_parser = crate::token::parse_ttl)]
    reap_every: TimeDelta,
    /// How often the VM reaper sweeps the running VMs for stuck and idle ones (fuse's
    /// reconcile interval).
    #[arg(long, env = "LEASEHOLD_VM_SWEEP_EVERY", default_value = "30s",
          value_parser = crate::token::parse_ttl)]
    vm_sweep_every: TimeDelta,
    /// A running VM older than this (unless it asks for its own `maxRuntimeSeconds`) is stuck;
    /// on two sweeps in a row it is destroyed. A leak-detection ceiling, not a liveness check.
    #[arg(long, env = "LEASEHOLD_VM_STUCK_AFTER", default_value = "2h",
          value_parser = crate::token::parse_ttl)]
    vm_stuck_after: TimeDelta,
    /// A running VM with no exec or attach this long (unless it asks for its own
    /// `idleTimeoutSeconds`) is idle; default: only VMs that ask are.
    #[arg(long, env = "LEASEHOLD_VM_IDLE_AFTER", value_parser = crate::token::parse_ttl)]
    vm_idle_after: Option<TimeDelta>,
    /// How often each host's agent is listed and squared with the log (a VM the agent lost
    /// is destroyed, an orphan the log does not know is deleted).
    #[arg(long, env = "LEASEHOLD_VM_INVENTORY_EVERY", default_value = "30s",
          value_parser = crate::token::parse_ttl)]
    vm_inventory_every: TimeDelta,
    /// The retention of a snapshot created without one (`retentionUntil`); default: kept
    /// until deleted (fuse's `DefaultSnapshotRetention` of zero).
    #[arg(long, env = "LEASEHOLD_SNAPSHOT_RETENTION", value_parser = crate::token::parse_ttl)]
    snapshot_retention: Option<TimeDelta>,
    /// How often retention GC deletes the snapshots past their retention (never a build
    /// artifact, a VM's latest snapshot or a parent of a live child).
    #[arg(long, env = "LEASEHOLD_SNAPSHOT_GC_EVERY", default_value = "1h",
          value_parser = crate::token::parse_ttl)]
    snapshot_gc_every: TimeDelta,
    /// Most ready build layers a tenant keeps: past it, the least recently used are evicted
    /// (each an event) on GC's sweep. Default: no cap.
    #[arg(long, env = "LEASEHOLD_SNAPSHOT_LAYER_CAP")]
    snapshot_layer_cap: Option<usize>,
    /// A snapshot creating this long with no answer from its host's agent is given up on
    /// (recorded as failed, its quota given back). Above the agent's own 600 s snapshot limit.
    #[arg(long, env = "LEASEHOLD_SNAPSHOT_STUCK_AFTER", default_value = "1h",
          value_parser = crate::token::parse_ttl)]
    snapshot_stuck_after: TimeDelta,
    /// How long a host's agent that took an export on (answered 202) has to report it through
    /// `reportSnapshotExport`; past it the export is recorded as failed (it may be asked
    /// again).
    #[arg(long, env = "LEASEHOLD_SNAPSHOT_EXPORT_WITHIN", default_value = "6h",
          value_parser = crate::token::parse_ttl)]
    snapshot_export_within: TimeDelta,
    /// The rental provider connections to rent through, in a JSON file (each connection's
    /// agent URL, token file and declared capabilities; see `adapters/src/providers/config.rs`).
    /// Without it, no rental can be provisioned.
    #[arg(long, env = "LEASEHOLD_PROVIDERS_FILE")]
    providers_file: Option<std::path::PathBuf>,
    /// Where node agents on rented machines enroll: the `control_plane_url` of the bootstraps
    /// handed to providers (default: the callback base URL).
    #[arg(long, env = "LEASEHOLD_NODE_AGENT_URL")]
    node_agent_url: Option<String>,
    /// How often rented nodes whose lease passed are lost and rentals past their max lifetime
    /// terminated.
    #[arg(long, env = "LEASEHOLD_RENTED_SWEEP_EVERY", default_value = "10s",
          value_parser = crate::token::parse_ttl)]
    rented_sweep_every: TimeDelta,
    /// How often each rental's provider is asked for a look at its machine (with
    /// `--providers-file`).
    #[arg(long, env = "LEASEHOLD_RENTAL_OBSERVE_EVERY", default_value = "15s",
          value_parser = crate::token::parse_ttl)]
    rental_observe_every: TimeDelta,
    /// Most pooled database connections the server opens for its requests and commands
    /// (each projection and reconciler holds one more of its own, for its lock).
    #[arg(long, env = "LEASEHOLD_DATABASE_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(2..=1_000))]
    database_pool_size: u64,
    /// How long a run's launch may go unanswered by its node before it is recorded
    /// indeterminate and the node is asked for its reconciliation (looked at every
    /// `--rented-sweep-every`).
    #[arg(long, env = "LEASEHOLD_LAUNCH_ANSWER_WITHIN", default_value = "2m",
          value_parser = crate::token::parse_ttl)]
    launch_answer_within: TimeDelta,
    /// How often runner leases whose holders stopped reporting are reaped (quarantined when
    /// they may hold compute, failed otherwise).
    #[arg(long, env = "LEASEHOLD_RUNNER_REAP_EVERY", default_value = "10s",
          value_parser = crate::token::parse_ttl)]
    runner_reap_every: TimeDelta,
    /// The runner nodes whose provider agents launch CI runner instances, and the issuer
    /// their registrations are minted from, in a JSON file (see
    /// `adapters/src/runner_providers/config.rs`). Without it, runner leases are never
    /// launched.
    #[arg(long, env = "LEASEHOLD_RUNNER_NODES_FILE")]
    runner_nodes_file: Option<std::path::PathBuf>,
    /// How often each runner node's instances are listed and those of leases that ended or
    /// never were destroyed (with `--runner-nodes-file`).
    #[arg(long, env = "LEASEHOLD_RUNNER_ORPHANS_EVERY", default_value = "60s",
          value_parser = crate::token::parse_ttl)]
    runner_orphans_every: TimeDelta,
}

impl ServeArgs {
    /// How the reconcilers are set.
    fn reconciling(&self) -> crate::dispatch::Reconciling {
        crate::dispatch::Reconciling {
            inventory_every: self.inventory_every,
            health_every: self.health_every.to_std().unwrap_or(Duration::from_secs(10)),
            retention_max_age: self.retention_max_age,
            retention: leasehold_adapters::retention::RetentionPolicy {
                per_tenant: self.retained_per_tenant,
                sweep_every: self.reap_every,
            },
            callback_deadline: self.callback_deadline,
        }
    }
}

/// Runs until a stop signal.
pub async fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let (url, _cluster) = match &args.database_url {
        Some(url) => (DatabaseUrl::parse(url).context("--database-url")?, None),
        None => cluster::local_or_private(&args.secret.data_dir()?).await?,
    };
    database::ensure_exists(&url).await?;
    let report = leasehold_adapters::migrate(&url).await?;
    if !report.applied.is_empty() {
        tracing::info!(applied = ?report.applied, "migrations applied");
    }
    let pool_size = usize::try_from(args.database_pool_size).unwrap_or(16);
    let store = PgEventStore::new(&url, StoreConfig { pool_size, ..StoreConfig::default() })
        .context("--database-url")?;
    let (stop, stopped) = watch::channel(false);
    let batch_events = usize::try_from(args.projection_batch).unwrap_or(1_000);
    let runner_config = RunnerConfig { batch_events, ..RunnerConfig::default() };
    let start = crate::projectors::Start {
        config: runner_config,
        rebuild_on_version_change: args.rebuild_on_version_change,
    };
    let projectors = crate::projectors::start(&store, start, &stopped);
    let progress = projectors.progress.clone();
    let secret = args.secret.secret()?;
    let mut demo =
        if args.demo { Some(crate::demo::sims::Simulators::start().await?) } else { None };
    let backends = match (&args.backends_file, demo.as_mut()) {
        (Some(file), _) => Some(crate::dispatch::backends(file)?),
        (None, Some(demo)) => demo.backends.take(),
        (None, None) => None,
    };
    let providers = match (&args.providers_file, demo.as_mut()) {
        (Some(file), _) => leasehold_adapters::providers::config::load(file)?,
        (None, Some(demo)) => std::mem::take(&mut demo.providers),
        (None, None) => Vec::new(),
    };
    let runner_nodes = match (&args.runner_nodes_file, demo.as_mut()) {
        (Some(file), _) => Some(leasehold_adapters::runner_providers::config::load(file)?),
        (None, Some(demo)) => demo.runner_nodes.take(),
        (None, None) => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {} (--listen)", args.listen))?;
    let address = listener.local_addr()?;
    let base = args.callback_base_url.clone().unwrap_or_else(|| format!("http://{address}"));
    // Manifests are kept whether the dispatcher sends them or agents take them (`work`).
    let manifests = leasehold_adapters::dispatch::ManifestVault::new(store.clone(), &secret);
    let mut state = AppState::new(store.clone(), &secret, gateway_config(args)?, progress)
        .context("the JWT secret")?
        .with_callback_secret(&args.secret.callback()?)
        .context("the callback secret")?
        .with_vm_credentials_key(&vm_credentials_key(args)?)
        .with_callback_base(&base)
        .with_manifests(manifests.clone())
        .with_rentals(rental_config(args, &base, &providers)?)
        .with_rebuilds(Arc::new(crate::projectors::ServeRebuilds::new(&store, batch_events)));
    if let Some((backends, order)) = &backends {
        let secrets = backends.iter().map(|(name, b)| (name.clone(), b.config().secret.clone()));
        let router = leasehold_adapters::backends::Router::new(backends, order);
        state =
            state.with_backend_secrets(secrets.collect::<Vec<_>>()).with_router(Arc::new(router));
    }
    let lag = tokio::spawn(log_lag(store.clone(), stopped.clone()));
    let seal_every = usize::try_from(args.seal_every).unwrap_or(1_000);
    // The sealer stops last, after the gateway and the projectors, so that its final seal
    // covers what the gateway's last requests appended.
    let (stop_sealer, sealer_stopped) = watch::channel(false);
    let sealer = tokio::spawn(crate::sealer::run(store.clone(), seal_every, sealer_stopped));
    let reconciling = args.reconciling();
    let mut reconcilers = match backends {
        Some((backends, names)) => {
            let placed_on = placement(args)?;
            let works = (backends, manifests);
            let tasks = crate::dispatch::start(
                state.pipeline(),
                works,
                (&base, placed_on),
                &reconciling,
                &stopped,
            );
            tracing::info!(backends = ?names, callbacks = %base, "dispatching lease work");
            tasks
        }
        None => Vec::new(),
    };
    // Hosts are registered through the gateway, each with its agent's URL and token: the VM
    // dispatcher always runs.
    let agent_timeout = std::time::Duration::from_secs(HOST_AGENT_TIMEOUT_SECONDS);
    reconcilers.push(crate::dispatch::start_vm_dispatcher(
        state.vms(),
        state.vault(),
        agent_timeout,
        &stopped,
    )?);
    let vm_reaping = leasehold_adapters::vm_reaper::VmReapPolicy {
        sweep_every: args.vm_sweep_every,
        stuck_after: args.vm_stuck_after,
        idle_after: args.vm_idle_after,
    };
    reconcilers.push(crate::dispatch::start_vm_reaper(state.vms(), vm_reaping, &stopped));
    if let Some(brokers) = &args.relay_kafka_brokers {
        let mut config = leasehold_adapters::relay::RelayConfig::new(brokers, &args.relay_topic);
        config.settings = crate::relay::kafka_settings(args.relay_kafka_config.as_deref())?;
        reconcilers.push(crate::relay::spawn(
            store.clone(),
            config,
            stopped_future(stopped.clone()),
        )?);
        tracing::info!(%brokers, topic = %args.relay_topic, "relaying the log to Kafka");
    }
    reconcilers.push(crate::dispatch::start_snapshot_dispatcher(
        state.snapshots(),
        state.vault(),
        (agent_timeout, args.snapshot_export_within),
        &stopped,
    )?);
    reconcilers.push(crate::dispatch::start_snapshot_gc(
        state.snapshots(),
        (args.snapshot_gc_every, args.snapshot_layer_cap, args.snapshot_stuck_after),
        &stopped,
    ));
    reconcilers.push(crate::dispatch::start_vm_inventory(
        state.vms(),
        state.vault(),
        (agent_timeout, args.vm_inventory_every),
        &stopped,
    )?);
    // Rented capacity's reconcilers run only where a provider connection is configured:
    // without one no rental can be asked for, so there is nothing for them to do, and each
    // holds a connection of its own (its lock) for as long as it runs.
    if !providers.is_empty() {
        reconcilers.push(crate::dispatch::start_run_dispatcher(state.rented(), &stopped));
        reconcilers.push(crate::dispatch::start_rented_expiry(
            state.rented(),
            args.rented_sweep_every,
            &stopped,
        ));
        reconcilers.push(crate::dispatch::start_launch_reconciler(
            state.rented(),
            (args.launch_answer_within, args.rented_sweep_every),
            &stopped,
        ));
        let providers = crate::dispatch::providers(providers)?;
        // The demo's machines move a step at each look: looked at often, a rental is active
        // within seconds rather than a minute.
        let observe_every = if args.demo {
            args.rental_observe_every.min(TimeDelta::seconds(2))
        } else {
            args.rental_observe_every
        };
        reconcilers.extend(crate::dispatch::start_rental_dispatch(
            &state.rented().rentals,
            &providers,
            observe_every,
            &stopped,
        ));
    }
    if let Some(file) = runner_nodes {
        let orphans = (file, args.runner_orphans_every);
        reconcilers.extend(crate::dispatch::start_runner_dispatcher(
            state.rented(),
            orphans,
            &stopped,
        )?);
    }
    reconcilers.extend(crate::dispatch::start_runner_reconcilers(
        state.rented(),
        args.runner_reap_every,
        &stopped,
    ));
    reconcilers.extend(crate::dispatch::start_reaper(
        state.pipeline(),
        placement(args)?,
        &reconciling,
        &stopped,
    ));
    let demo_driver = match demo.as_mut() {
        Some(demo) => Some(crate::demo::driver::spawn(
            &format!("http://{address}"),
            &JwtSecret::new(&secret)?,
            demo.hosts(),
            stopped.clone(),
        )?),
        None => None,
    };
    let gateway = tokio::spawn(leasehold_gateway::serve(listener, state, stopped_future(stopped)));
    println!(
        "leasehold serve: {} at {}; projections {} running; listening on http://{address}. \
         Stop with Ctrl-C or SIGTERM.\n  Dashboard: http://{address}/ (sign in with a token)\n  \
         GraphQL:   http://{address}/graphql (GraphiQL in a browser; WebSocket at /graphql/ws)",
        url.database(),
        url.endpoint(),
        crate::projectors::NAMES.join(", ")
    );
    // Only for a secret made here: tokens signed with an operator's own secret are theirs
    // to make (`leasehold token`), never printed where logs collect them.
    if args.secret.generated() {
        print_demo_tokens(&JwtSecret::new(&secret)?);
    }
    if args.demo {
        println!(
            "demo: every outside system is simulated in this process; the tenant demo's \
             leases, VMs, snapshots, rentals, runs and runner leases change every few seconds. \
             Open the dashboard and sign in with the tenant demo's token (or the operator's)."
        );
    }
    let signal = stop_signal().await?;
    tracing::info!(signal, "stopping");
    stop.send_replace(true);
    let wait = Duration::from_secs(STOP_WAIT_SECONDS);
    let served = tokio::time::timeout(wait, gateway).await;
    let mut finished = Vec::new();
    for (name, task) in projectors.tasks {
        finished.push((name, tokio::time::timeout(wait, task).await));
    }
    let mut reconciled = Vec::new();
    for task in reconcilers {
        reconciled.push(tokio::time::timeout(wait, task).await);
    }
    lag.abort();
    if let Some(driver) = demo_driver {
        driver.abort();
    }
    stop_sealer.send_replace(true);
    let sealed = tokio::time::timeout(wait, sealer).await;
    served.context("the gateway did not stop in time")?.context("the gateway failed")??;
    for (name, finished) in finished {
        let stopped_in_time =
            finished.with_context(|| format!("projection {name} did not stop in time"))?;
        stopped_in_time.with_context(|| format!("projection {name} failed"))?;
    }
    for stopped_in_time in reconciled {
        stopped_in_time
            .context("a reconciler did not stop in time")?
            .context("a reconciler failed")?;
    }
    sealed.context("the sealer did not stop in time")?.context("the sealer failed")?;
    let read_models = PgReadModels::of(&store);
    for name in crate::projectors::NAMES {
        let stopped = match read_models.checkpoint(name).await? {
            Some(cursor) => format!("stopped; {name} checkpoint at {cursor}"),
            None => format!("stopped; {name} has applied nothing yet"),
        };
        // Whoever started us may have closed our standard output by now: not worth a panic.
        let _ = writeln!(std::io::stdout(), "{stopped}");
    }
    Ok(())
}

/// The backend new leases are placed on.
fn placement(args: &ServeArgs) -> anyhow::Result<BackendName> {
    BackendName::parse("--backend", args.backend.as_str())
        .map_err(|error| anyhow::anyhow!("{error}"))
}

fn gateway_config(args: &ServeArgs) -> anyhow::Result<GatewayConfig> {
    Ok(GatewayConfig {
        backend: Some(placement(args)?),
        consistency_wait: Duration::from_millis(args.consistency_wait_ms),
        ws_init_wait: Duration::from_millis(args.ws_init_timeout_ms),
        ws_ping_every: Duration::from_millis(args.ws_ping_interval_ms),
        ws_send_wait: Duration::from_millis(args.ws_send_timeout_ms),
        retention_max_age: args.retention_max_age,
        snapshots: leasehold_commands::snapshot_service::SnapshotConfig {
            default_retention: args.snapshot_retention,
            gc_dead_letter_after: 0,
        },
        ..GatewayConfig::default()
    })
}

/// Completes once `stopped` turns true.
pub(crate) async fn stopped_future(mut stopped: watch::Receiver<bool>) {
    // An error means the sender is gone: stop then too.
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// Tokens for trying it out, signed with the data directory's secret (valid for a day).
fn print_demo_tokens(secret: &JwtSecret) {
    let day = TimeDelta::days(1);
    let demo = TenantId::parse(DEMO_TENANT).expect("a valid tenant name");
    println!("Demo tokens (valid 24 h; make more with `leasehold token`):");
    let tokens = [
        ("tenant demo", secret.mint_for("demo-user", Role::Tenant, Some(&demo), None, day)),
        ("operator", secret.mint_for("operator", Role::Operator, None, None, day)),
        ("auditor", secret.mint_for("auditor", Role::Auditor, None, None, day)),
        ("agent (all providers)", secret.mint_agent_for_all_providers("agent", day)),
    ];
    for (who, token) in tokens {
        println!("  {who:<21} {token}");
    }
}

/// Waits for SIGINT or SIGTERM and names it.
pub(crate) async fn stop_signal() -> anyhow::Result<&'static str> {
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
        let horizon = PgReadModels::of(&store).horizon_lag_seconds().await.unwrap_or_default();
        match PgReadModels::of(&store).projection_status().await {
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

/// The rental services' settings: the providers file's connections, each declaration
/// validated (a bad one stops `serve` with the connection named), and the enrollment key.
fn rental_config(
    args: &ServeArgs,
    base: &str,
    providers: &[leasehold_adapters::providers::ProviderConfig],
) -> anyhow::Result<leasehold_commands::rental_service::RentalConfig> {
    use leasehold_commands::rental_service::{Connections, RentalConfig};
    let mut connections = Connections::default();
    for provider in providers {
        let name = provider.connection.clone();
        connections
            .register(provider.connection.clone(), provider.support)
            .with_context(|| format!("provider connection {name}"))?;
    }
    let key = leasehold_commands::enrollment::EnrollmentKey::new(
        args.secret.enrollment_key()?.trim_ascii(),
    )
    .context("the enrollment key (--enrollment-key-file)")?;
    Ok(RentalConfig {
        connections,
        control_plane_url: args.node_agent_url.clone().unwrap_or_else(|| base.to_string()),
        agent_version: leasehold_gateway::NODE_AGENT_VERSION.into(),
        key,
    })
}

/// The key VMs' credentials are sealed under: at least 32 bytes, as every secret.
fn vm_credentials_key(args: &ServeArgs) -> anyhow::Result<Vec<u8>> {
    let key = args.secret.vm_credentials_key()?;
    anyhow::ensure!(
        key.trim_ascii().len() >= 32,
        "the VM credentials' key (--vm-credentials-key-file) must be at least 32 bytes"
    );
    Ok(key)
}
