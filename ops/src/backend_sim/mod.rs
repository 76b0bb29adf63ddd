//! `leasehold backend-sim`: a lease backend that speaks the backends' protocol as one written
//! for fred would (the facts it holds to: `docs/issue-10-research.md`), in memory, for tests
//! and demos. It verifies every signed request's `X-Fred-Signature`, answers with fred's
//! status codes and error envelope, and reports each provision's outcome by a signed callback
//! to the URL the provision named, after `--callback-delay-ms`.
//!
//! Served so far: provision, restart, update, restore (`maintenance.rs`), info, deprovision
//! (keeping the data with `--retain`), provisions (keyset pages, lookups and point reads),
//! retentions (keyset pages), health and stats. Its own routes: `GET /sim/requests` counts
//! the requests received per route (and `provision-accepted`, the provisions it acted on); `POST /sim/sweep/{lease}` is the backend's own retention
//! sweep destroying one lease's retained data; `POST /sim/fail/{lease}` fails a ready lease
//! for good (its container exited), reported by callback (`?callback=false`: only listed). `--fault` makes it misbehave (fail, refuse,
//! answer garbage, time out, roll back, omit the maintenance stamp, report an exhausted
//! budget, list without tenants, never complete a listing); `--orphan` holds a provision
//! nobody asked for. Logs, releases and custom domains follow.

mod gate;
pub mod host_agent;
mod maintenance;
pub mod node;
pub mod provider;
mod routes;
pub mod runner_provider;
mod tls;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use leasehold_adapters::backends::SigningSecret;
use uuid::Uuid;

/// `leasehold backend-sim`.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Address to listen on (port 0: any free port). The first line on standard output is
    /// `listening on http://ADDRESS`.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// File holding the secret shared with the control plane (at least 32 bytes): requests
    /// must be signed with it, callbacks are. (Not for `--host-agent` or `--provider`.)
    #[arg(long, required_unless_present_any = ["host_agent", "provider", "runner_provider"])]
    pub secret_file: Option<PathBuf>,
    /// Be a runner node's provider agent instead (billet's provider interface over HTTP,
    /// `docs/billet-protocol.md` §1), with a registration issuer (GitHub's
    /// `generate-jitconfig`) beside it, wanting the bearer token in `--token-file` on both.
    #[arg(long, requires = "token_file", conflicts_with_all = ["host_agent", "provider"])]
    pub runner_provider: bool,
    /// For `--runner-provider`: the backend kind it reports.
    #[arg(long, default_value = "docker")]
    pub runner_kind: String,
    /// For `--runner-provider`: a trust class it refuses (it always refuses `unknown`).
    #[arg(long)]
    pub refuse_trust: Option<String>,
    /// For `--runner-provider`: each instance's first launch makes it and answers 504, as a
    /// proxy that lost the answer.
    #[arg(long)]
    pub lose_launch_answers: bool,
    /// For `--runner-provider`: every launch is refused for good (400 `NO_CAPACITY`).
    #[arg(long)]
    pub refuse_launches: bool,
    /// For `--runner-provider`: an instance's first destroy answers `requested`, the next
    /// `stopped`.
    #[arg(long)]
    pub teardown_requested_first: bool,
    /// For `--runner-provider`: every destroy fails (500 `DESTROY_FAILED`), as a node whose
    /// backend cannot reach its instances.
    #[arg(long)]
    pub fail_destroys: bool,
    /// For `--runner-provider`: the first this many `Find`s of each name answer not found,
    /// as a backend whose listing lags.
    #[arg(long, default_value_t = 0)]
    pub find_misses: u32,
    /// Be a rental provider's agent instead (Leasehold's provider protocol,
    /// `docs/mercator-protocol.md` §1), wanting the bearer token in `--token-file`.
    #[arg(long, requires = "token_file", conflicts_with = "host_agent")]
    pub provider: bool,
    /// For `--provider`: the capabilities it declares and holds to, as the providers file's
    /// `capabilities` JSON (default: every one, idempotent provision by operation key).
    #[arg(long)]
    pub capabilities: Option<String>,
    /// For `--provider`: every provision fails (500) and allocates nothing.
    #[arg(long)]
    pub fail_provisions: bool,
    /// For `--provider`: every provision is refused for good (400 `NO_CAPACITY`).
    #[arg(long)]
    pub refuse_provisions: bool,
    /// For `--provider`: each rental's first provision makes the machine and answers 504, as
    /// a proxy that lost the answer.
    #[arg(long)]
    pub lose_provision_answers: bool,
    /// For `--provider`: every machine runs a simulated node agent from its bootstrap
    /// (enrolls, beats, takes its commands, reports its workloads).
    #[arg(long)]
    pub nodes: bool,
    /// For `--nodes`: how often a node beats, in milliseconds.
    #[arg(long, default_value_t = 20_000)]
    pub node_beat_ms: u64,
    /// For `--nodes`: how long a launched workload runs before it exits 0, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub node_run_ms: u64,
    /// For `--nodes`: each node loses the first launch it is sent (never applied, never
    /// answered), as an agent that crashed as it arrived.
    #[arg(long)]
    pub node_drop_first_launch: bool,
    /// Be a host agent instead (fuse's contract: `POST /v1/vm` and the rest), wanting the
    /// bearer token in `--token-file`.
    #[arg(long, requires = "token_file")]
    pub host_agent: bool,
    /// For `--host-agent` and `--provider`: the file holding the bearer token callers must
    /// present.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// For `--host-agent`: every boot fails (500, rolled back), as a broken host.
    #[arg(long)]
    pub fail_boots: bool,
    /// For `--host-agent`: every delete fails (500), as a host whose VMs will not die.
    #[arg(long)]
    pub fail_deletes: bool,
    /// For `--host-agent`: exports are taken on (202) and never written, as an agent that
    /// reports them later (through GraphQL) would.
    #[arg(long)]
    pub export_later: bool,
    /// The backend's name, sent in callbacks.
    #[arg(long, default_value = "sim-1")]
    pub name: String,
    /// How long a provision takes before its callback is sent.
    #[arg(long, default_value_t = 50)]
    pub callback_delay_ms: u64,
    /// Misbehave as a real backend can (repeatable): `fail` (provisions report failed),
    /// `refuse-validation` (400 `unknown_sku`), `refuse-capacity` (503), `garbage` (400 with an
    /// HTML body, not the error envelope), `timeout` (never answer a provision), `rollback` (restarts
    /// and updates fail and roll back), `omit-stamp` (completions echo no maintenance id or
    /// stamp, as an older backend), `no-stats` (`GET /stats` answers 404), `exhausted-budget`
    /// (a failed provision's listing says no retries are left), `anonymous-inventory`
    /// (listings name no tenant), `partial-inventory` (`GET /provisions` never completes),
    /// `demote-overflow` (a restore into another SKU tier does not fit the retained data).
    #[arg(long = "fault", value_enum)]
    pub faults: Vec<Fault>,
    /// The CPU cores `GET /stats` reports allocated, out of 64 (default: one per ready
    /// provision), so that routing tests can make one backend look busier.
    #[arg(long)]
    pub allocated_cpu_cores: Option<f64>,
    /// Keep a released lease's data (as fred's docker backend with `retain_on_close`): the
    /// provision stays, `retained`, until a restore consumes it.
    #[arg(long)]
    pub retain: bool,
    /// A provision of this lease is held from the start, ready, though nobody asked for it
    /// (repeatable): what a crash between a backend's create and the control plane's record
    /// leaves behind, an orphan.
    #[arg(long = "orphan")]
    pub orphans: Vec<Uuid>,
    /// Serve HTTPS with this certificate chain (PEM; with --tls-key-file), as fred's
    /// backends do with `tls_cert_file`.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Require a client certificate signed by this CA (PEM): mutual TLS, as fred's
    /// `tls_client_ca_file`.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<PathBuf>,
}

/// One way the simulator misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Provisions are accepted, then report failed.
    Fail,
    /// Provisions are refused as invalid (`400`, `validation_code: unknown_sku`).
    RefuseValidation,
    /// Provisions are refused for capacity (`503`).
    RefuseCapacity,
    /// Provisions answer 400 with an HTML page, not the error envelope.
    Garbage,
    /// Provisions are never answered.
    Timeout,
    /// Restarts and updates fail and roll back to what ran before.
    Rollback,
    /// Completions echo no maintenance id or stamp, as a backend that predates them.
    OmitStamp,
    /// `GET /stats` answers 404, as a backend without it (routing then has no signal).
    NoStats,
    /// A failed provision's listing reports its failure budget exhausted (fred's
    /// `terminal_budget`); without it no budget is reported, as an older backend.
    ExhaustedBudget,
    /// Listings name no tenant, as an older or third-party backend: not identity-bearing.
    AnonymousInventory,
    /// `GET /provisions` never completes: the first page promises another, which fails.
    PartialInventory,
    /// A restore into another SKU tier is a demote whose retained data does not fit
    /// (`422 demote_exceeds_tier`); without it, another tier fits.
    DemoteOverflow,
}

/// One provision the simulator holds.
#[derive(Debug, Clone)]
struct Provision {
    request: leasehold_adapters::backends::wire::ProvisionRequest,
    status: &'static str,
    created_at: chrono::DateTime<chrono::Utc>,
    /// Its releases so far (a provision or restore is the first; each update that took, one
    /// more).
    releases: u32,
}

impl Provision {
    /// A ready provision of `lease` that nobody asked for.
    fn orphan(lease: Uuid) -> Self {
        let request = leasehold_adapters::backends::wire::ProvisionRequest {
            lease_uuid: lease,
            tenant: "nobody".into(),
            provider_uuid: Uuid::nil(),
            items: Vec::new(),
            callback_url: String::new(),
            lifecycle_callback_url: None,
            payload: None,
            payload_hash: None,
        };
        Self { request, status: "ready", created_at: chrono::Utc::now(), releases: 1 }
    }
}

/// What every handler shares.
#[derive(Debug, Clone)]
struct Sim {
    name: String,
    secret: SigningSecret,
    callback_delay: Duration,
    provisions: Arc<Mutex<BTreeMap<Uuid, Provision>>>,
    /// How it misbehaves.
    faults: Arc<Vec<Fault>>,
    /// What `GET /stats` reports allocated, if fixed.
    allocated_cpu_cores: Option<f64>,
    /// Whether a release keeps the data.
    retain: bool,
    /// Requests received per route (`GET /sim/requests`, for tests).
    received: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    http: reqwest::Client,
}

impl Sim {
    fn provisions(&self) -> std::sync::MutexGuard<'_, BTreeMap<Uuid, Provision>> {
        self.provisions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether it misbehaves this way.
    fn has(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }

    /// Counts one request to `route`.
    fn received(&self, route: &'static str) {
        let mut received = self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *received.entry(route).or_default() += 1;
    }
}

/// Serves until SIGINT or SIGTERM.
pub async fn run(args: &SimArgs) -> anyhow::Result<()> {
    if args.host_agent {
        return run_host_agent(args).await;
    }
    if args.provider {
        return run_provider(args).await;
    }
    if args.runner_provider {
        return run_runner_provider(args).await;
    }
    let secret_file = args.secret_file.as_ref().context("--secret-file is required")?;
    let bytes = std::fs::read(secret_file)
        .with_context(|| format!("reading --secret-file {}", secret_file.display()))?;
    let secret = SigningSecret::new(&bytes).context("--secret-file")?;
    let sim = Sim::new(&args.name, secret, Duration::from_millis(args.callback_delay_ms))?;
    let sim = Sim {
        faults: Arc::new(args.faults.clone()),
        allocated_cpu_cores: args.allocated_cpu_cores,
        retain: args.retain,
        ..sim
    };
    for lease in &args.orphans {
        sim.provisions().insert(*lease, Provision::orphan(*lease));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    if let (Some(cert), Some(key)) = (&args.tls_cert_file, &args.tls_key_file) {
        let config = tls::server_config(cert, key, args.tls_client_ca_file.as_deref())?;
        println!("listening on https://{}", listener.local_addr()?);
        return tls::serve(listener, routes::router(sim), config).await;
    }
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, routes::router(sim))
        .with_graceful_shutdown(async {
            if let Err(error) = crate::serve::stop_signal().await {
                tracing::warn!(%error, "backend-sim stops");
            }
        })
        .await
        .context("serving")
}

/// `--host-agent`: serves fuse's host agent contract until SIGINT or SIGTERM.
async fn run_host_agent(args: &SimArgs) -> anyhow::Result<()> {
    let token = token_of(args, "--host-agent")?;
    let token = token.as_str();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    let agent = host_agent::HostAgent::new(token, (args.fail_boots, args.fail_deletes))
        .exporting_later(args.export_later);
    serve_until_stopped(listener, host_agent::router(agent)).await
}

/// `--provider`: serves the provider protocol until SIGINT or SIGTERM.
async fn run_provider(args: &SimArgs) -> anyhow::Result<()> {
    let token = token_of(args, "--provider")?;
    let token = token.as_str();
    let support = match &args.capabilities {
        Some(json) => {
            let support: leasehold_domain::rental::CapacitySupport =
                serde_json::from_str(json).context("--capabilities")?;
            support.validate().context("--capabilities")?;
            support
        }
        None => provider::every_capability(),
    };
    let faults = provider::ProviderFaults {
        fail_provisions: args.fail_provisions,
        refuse_provisions: args.refuse_provisions,
        lose_first_answers: args.lose_provision_answers,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    let mut provider = provider::Provider::new(token, support, faults);
    if args.nodes {
        provider = provider.with_nodes(node::NodeOptions {
            beat_every: Duration::from_millis(args.node_beat_ms.max(100)),
            run_for: Duration::from_millis(args.node_run_ms),
            drop_first_launch: args.node_drop_first_launch,
        });
    }
    serve_until_stopped(listener, provider::router(provider)).await
}

/// The bearer token in `--token-file`, which `flag` needs.
fn token_of(args: &SimArgs, flag: &str) -> anyhow::Result<String> {
    let file = args.token_file.as_ref().with_context(|| format!("{flag} needs --token-file"))?;
    let token = std::fs::read_to_string(file)
        .with_context(|| format!("reading --token-file {}", file.display()))?;
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "--token-file is empty");
    Ok(token.to_owned())
}

/// Serves `router` on `listener` until SIGINT or SIGTERM.
async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    router: axum::Router,
) -> anyhow::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            if let Err(error) = crate::serve::stop_signal().await {
                tracing::warn!(%error, "backend-sim stops");
            }
        })
        .await
        .context("serving")
}

/// `--runner-provider`: serves the runner provider protocol and the issuer until SIGINT or
/// SIGTERM.
async fn run_runner_provider(args: &SimArgs) -> anyhow::Result<()> {
    let token = token_of(args, "--runner-provider")?;
    let token = token.as_str();
    let refuse_trust = args
        .refuse_trust
        .as_deref()
        .map(|trust| leasehold_domain::runner::TrustClass::parse("--refuse-trust", trust))
        .transpose()?;
    let faults = runner_provider::RunnerFaults {
        kind: args.runner_kind.clone(),
        refuse_trust,
        lose_launch_answers: args.lose_launch_answers,
        refuse_launches: args.refuse_launches,
        teardown_requested_first: args.teardown_requested_first,
        fail_destroys: args.fail_destroys,
        find_misses: args.find_misses,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    let provider = runner_provider::RunnerProvider::new(token, faults);
    serve_until_stopped(listener, runner_provider::router(provider)).await
}

/// Serves a well-behaved simulator named `name` on `listener` inside this process until the
/// task is aborted (`bench dispatch`).
///
/// # Errors
/// Its HTTP client cannot be built.
pub fn spawn(
    listener: tokio::net::TcpListener,
    name: &str,
    secret: SigningSecret,
    callback_delay: Duration,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let router = routes::router(Sim::new(name, secret, callback_delay)?);
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "the in-process backend-sim stopped");
        }
    }))
}

impl Sim {
    fn new(name: &str, secret: SigningSecret, callback_delay: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            name: name.to_string(),
            secret,
            callback_delay,
            provisions: Arc::default(),
            received: Arc::default(),
            faults: Arc::default(),
            allocated_cpu_cores: None,
            retain: false,
            http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?,
        })
    }
}
