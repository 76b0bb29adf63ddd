//! The outside systems of every kind, simulated in this process on the loopback for
//! `serve --demo`: a lease backend, two hosts' agents, a rental provider whose machines run
//! node agents, and a runner node's provider agent with its registration issuer. Each has a
//! fresh token of its own, known only to this process; each stops when [`Simulators`] is
//! dropped.

use std::time::Duration;

use anyhow::Context as _;
use leasehold_adapters::backends::{BackendConfig, SigningSecret};
use leasehold_adapters::providers::{ProviderConfig, ProviderToken};
use leasehold_adapters::runner_providers::{IssuerConfig, RunnerNodeConfig, RunnerNodesFile};

use crate::backend_sim::{host_agent, node, provider, runner_provider};

/// The simulated lease backend every lease is placed on.
pub const LEASE_BACKEND: &str = "demo-sim";

/// The simulated hosts, by id.
pub const HOSTS: [&str; 2] = ["demo-host-1", "demo-host-2"];

/// The simulated rental provider's connection.
pub const PROVIDER_CONNECTION: &str = "demo-provider";

/// The simulated runner node.
pub const RUNNER_NODE: &str = "demo-runner-1";

/// How long a simulated lease backend takes to call back.
const CALLBACK_DELAY: Duration = Duration::from_millis(500);

/// How long one exchange with a simulator may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a simulated rented node behaves: it beats every few seconds, and what it is launched
/// runs for a while, then exits 0.
const NODE: node::NodeOptions = node::NodeOptions {
    beat_every: Duration::from_secs(5),
    run_for: Duration::from_secs(20),
    drop_first_launch: false,
};

/// Aborts a task when dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every simulator, running, and what `serve` needs to reach each.
pub struct Simulators {
    /// The lease backends (one) and their names, for the lease dispatcher (taken by `serve`).
    pub backends: Option<(leasehold_adapters::dispatch::Backends, Vec<String>)>,
    /// Each host's id and its agent's URL; [`Simulators::host_token`] opens them all.
    pub hosts: Vec<(String, String)>,
    /// The bearer token the hosts' agents take.
    pub host_token: String,
    /// The rental provider's connection.
    pub providers: Vec<ProviderConfig>,
    /// The runner node and its registration issuer (taken by `serve`).
    pub runner_nodes: Option<RunnerNodesFile>,
    _tasks: Vec<AbortOnDrop>,
}

impl Simulators {
    /// Starts every simulator on a free port of the loopback.
    ///
    /// # Errors
    /// When a port cannot be had.
    pub async fn start() -> anyhow::Result<Self> {
        let mut tasks = Vec::new();
        let backends = lease_backend(&mut tasks).await?;
        let host_token = random_token();
        let mut hosts = Vec::new();
        for host in HOSTS {
            let agent = host_agent::HostAgent::new(&host_token, (false, false));
            let (url, task) = serve(host_agent::router(agent), host).await?;
            tasks.push(task);
            hosts.push((host.to_string(), url));
        }
        let providers = vec![rental_provider(&mut tasks).await?];
        let runner_nodes = runner_node(&mut tasks).await?;
        println!(
            "demo: simulated in this process: the lease backend {LEASE_BACKEND}, the hosts {}, \
             the rental provider {PROVIDER_CONNECTION} (its machines run node agents) and the \
             runner node {RUNNER_NODE}",
            HOSTS.join(" and ")
        );
        Ok(Self {
            backends: Some(backends),
            hosts,
            host_token,
            providers,
            runner_nodes: Some(runner_nodes),
            _tasks: tasks,
        })
    }

    /// What the demo's driver registers the hosts with.
    pub fn hosts(&self) -> super::driver::Hosts {
        super::driver::Hosts { agents: self.hosts.clone(), token: self.host_token.clone() }
    }
}

/// A token of 64 characters, random enough for simulators that live as long as this process
/// on the loopback only.
fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Serves `router` on a free port of the loopback; its URL and task.
async fn serve(router: axum::Router, what: &str) -> anyhow::Result<(String, AbortOnDrop)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .with_context(|| format!("a port for the demo's {what}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "a demo simulator stopped");
        }
    });
    Ok((url, AbortOnDrop(task)))
}

/// The lease backend (`leasehold backend-sim`), calling back after half a second.
async fn lease_backend(
    tasks: &mut Vec<AbortOnDrop>,
) -> anyhow::Result<(leasehold_adapters::dispatch::Backends, Vec<String>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("a port for the demo backend")?;
    let url = format!("http://{}", listener.local_addr()?);
    let secret = SigningSecret::new(random_token().as_bytes()).context("the demo secret")?;
    let sim = crate::backend_sim::spawn(listener, LEASE_BACKEND, secret.clone(), CALLBACK_DELAY)?;
    tasks.push(AbortOnDrop(sim));
    let backends = crate::dispatch::clients(vec![BackendConfig::new(LEASE_BACKEND, &url, secret)])?;
    Ok((backends, vec![LEASE_BACKEND.to_string()]))
}

/// A rental provider declaring every capability, each machine running a node agent.
async fn rental_provider(tasks: &mut Vec<AbortOnDrop>) -> anyhow::Result<ProviderConfig> {
    let token = random_token();
    let support = provider::every_capability();
    let sim = provider::Provider::new(&token, support, provider::ProviderFaults::default())
        .with_nodes(NODE);
    let (url, task) = serve(provider::router(sim), "rental provider").await?;
    tasks.push(task);
    Ok(ProviderConfig {
        connection: leasehold_domain::rental::ConnectionId::parse("demo", PROVIDER_CONNECTION)
            .map_err(|error| anyhow::anyhow!("{error}"))?,
        url,
        token: ProviderToken::new(&token).context("a provider token")?,
        timeout: EXCHANGE_TIMEOUT,
        support,
    })
}

/// A runner node's provider agent (docker), which also issues its registrations.
async fn runner_node(tasks: &mut Vec<AbortOnDrop>) -> anyhow::Result<RunnerNodesFile> {
    let token = random_token();
    let faults = runner_provider::RunnerFaults { kind: "docker".into(), ..Default::default() };
    let sim = runner_provider::RunnerProvider::new(&token, faults);
    let (url, task) = serve(runner_provider::router(sim), "runner node").await?;
    tasks.push(task);
    let token = ProviderToken::new(&token).context("a runner node token")?;
    let node = leasehold_domain::runner::RunnerNodeName::parse("demo", RUNNER_NODE)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok(RunnerNodesFile {
        issuer: IssuerConfig {
            url: format!("{url}/orgs/demo/actions/runners/generate-jitconfig"),
            token: token.clone(),
            runner_group_id: 1,
            timeout: EXCHANGE_TIMEOUT,
        },
        nodes: vec![RunnerNodeConfig { node, url, token, timeout: EXCHANGE_TIMEOUT }],
    })
}
