//! Leasehold's runner provider client and registration issuer client
//! (`leasehold_adapters::runner_providers`) against `leasehold backend-sim --runner-provider`
//! run as a separate process: the facts of `docs/billet-protocol.md` §1 that both hold to,
//! route by route, with the routes themselves read from the note's tables.

use std::path::PathBuf;
use std::time::Duration;

use leasehold_adapters::providers::ProviderError;
use leasehold_adapters::runner_providers::config::{IssuerConfig, RunnerNodeConfig};
use leasehold_adapters::runner_providers::wire::{JitConfig, LaunchSpec};
use leasehold_adapters::runner_providers::{JitIssuer, RunnerProviderClient};
use leasehold_domain::runner::{RunnerLeaseId, RunnerNodeName, Teardown, TrustClass};
use tokio::process::{Child, Command};
use uuid::Uuid;

const TOKEN: &str = "a-runner-agent-token-of-at-least-32-bytes";

/// The simulated agent, running until dropped.
struct Sim {
    url: String,
    dir: PathBuf,
    _child: Child,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start(extra: &[&str]) -> Sim {
    let dir = std::env::temp_dir().join(format!("leasehold-runner-provider-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command.args(["backend-sim", "--runner-provider", "--token-file"]).arg(&token_file).args(extra);
    let (url, child) = leasehold_tests::spawn_listening(command).await;
    Sim { url, dir, _child: child }
}

/// The runner nodes file of `sim` (written and read back, as `serve` reads it).
fn file_of(sim: &Sim) -> (RunnerNodeConfig, IssuerConfig) {
    let path = sim.dir.join("runner-nodes.json");
    let text = serde_json::json!({
        "issuer": { "url": format!("{}/orgs/acme/actions/runners/generate-jitconfig", sim.url),
                    "token_file": "token", "runner_group_id": 7, "timeout_seconds": 5 },
        "nodes": [{ "node": "docker-1", "url": sim.url, "token_file": "token", "timeout_seconds": 5 }],
    });
    std::fs::write(&path, text.to_string()).unwrap();
    let mut loaded =
        leasehold_adapters::runner_providers::config::load(&path).expect("a valid file");
    (loaded.nodes.remove(0), loaded.issuer)
}

fn clients(sim: &Sim) -> (RunnerProviderClient, JitIssuer) {
    let (node, issuer) = file_of(sim);
    assert_eq!(node.node, RunnerNodeName::parse("node", "docker-1").unwrap());
    (RunnerProviderClient::new(node).unwrap(), JitIssuer::new(issuer).unwrap())
}

fn spec(lease: RunnerLeaseId, jit_config: JitConfig) -> LaunchSpec {
    LaunchSpec {
        name: lease.instance_name(),
        lease: lease.0,
        tier: "linux-4x".into(),
        trust: "trusted".into(),
        guest_os: "linux".into(),
        vcpu: 4,
        memory_mb: 8192,
        command: vec!["./run.sh".into()],
        jit_config,
    }
}

/// Every documented route, with its placeholders filled, and its method.
fn documented() -> Vec<(reqwest::Method, String)> {
    let mut routes = Vec::new();
    for method in ["GET", "POST", "DELETE"] {
        for route in leasehold_tests::routes_in("billet-protocol.md", &format!("{method} ")) {
            let route = route
                .replace("<class>", "trusted")
                .replace("billet-<id>", &RunnerLeaseId(Uuid::nil()).instance_name())
                .replace("{id}", "c-none")
                .replace("{org}", "acme");
            routes.push((method.parse().unwrap(), route));
        }
    }
    routes
}

#[tokio::test]
async fn every_documented_route_is_served_behind_the_agents_token() {
    let sim = start(&[]).await;
    let routes = documented();
    assert_eq!(routes.len(), 7, "six of the agent's, one of the issuer's: {routes:?}");
    let http = reqwest::Client::new();
    for (method, route) in routes {
        let url = format!("{}{route}", sim.url);
        let anonymous = http.request(method.clone(), &url).send().await.unwrap();
        assert_eq!(anonymous.status().as_u16(), 401, "{method} {route} without the token");
        let wrong = http.request(method.clone(), &url).bearer_auth("not-it").send().await.unwrap();
        assert_eq!(wrong.status().as_u16(), 401, "{method} {route} with another token");
        let served = http.request(method.clone(), &url).bearer_auth(TOKEN).send().await.unwrap();
        assert!(
            ![401, 404, 405].contains(&served.status().as_u16()),
            "{method} {route} is served: {}",
            served.status()
        );
    }
}

#[tokio::test]
async fn an_instances_life_as_client_and_simulator_both_speak_it() {
    let sim = start(&["--refuse-trust", "untrusted"]).await;
    let (client, issuer) = clients(&sim);
    assert_eq!(client.kind().await, Ok("docker".into()));
    assert_eq!(client.accepts(TrustClass::Trusted).await, Ok(true));
    assert_eq!(client.accepts(TrustClass::Untrusted).await, Ok(false), "a refused class");
    // A registration, minted after the acceptance, shows nothing of itself in Debug.
    let registration = issuer.mint(&RunnerLeaseId(Uuid::nil()).instance_name(), "linux-4x").await;
    let registration = registration.expect("minted");
    assert!(!registration.expose().is_empty());
    assert_eq!(format!("{registration:?}"), "JitConfig([redacted])");
    let lease = RunnerLeaseId(Uuid::now_v7());
    let launched = client.launch(&spec(lease, registration.clone())).await.expect("launched");
    assert_eq!(
        (launched.name.as_str(), launched.running, launched.terminal),
        (lease.instance_name().as_str(), true, false)
    );
    // Find answers an explicit flag; an unknown name is not found, never a zero instance.
    assert_eq!(client.find(&lease.instance_name()).await, Ok(Some(launched.clone())));
    let other = RunnerLeaseId(Uuid::now_v7()).instance_name();
    assert_eq!(client.find(&other).await, Ok(None));
    assert_eq!(client.list().await.map(|all| all.len()), Ok(1));
    // One lease is one instance: launching its name again is refused for good.
    let again = client.launch(&spec(lease, registration.clone())).await;
    assert_eq!(again, Err(ProviderError::Refused { status: 409, code: "EXISTS".into() }));
    let mut empty = spec(RunnerLeaseId(Uuid::now_v7()), registration);
    empty.command.clear();
    assert!(matches!(client.launch(&empty).await, Err(ProviderError::Refused { status: 400, .. })));
    // Destroy proves the instance gone; an id already gone is success.
    assert_eq!(client.destroy(&launched.id).await, Ok(Teardown::Stopped));
    assert_eq!(client.destroy(&launched.id).await, Ok(Teardown::Stopped));
    assert_eq!(client.destroy("c-never-was").await, Ok(Teardown::Stopped));
    let gone = client.find(&lease.instance_name()).await.expect("answered").expect("listed");
    assert!(gone.terminal && !gone.running, "stopped ones stay listed, terminal: {gone:?}");
}

#[tokio::test]
async fn a_lost_launch_answer_leaves_an_instance_found_by_name() {
    let sim = start(&["--lose-launch-answers"]).await;
    let (client, issuer) = clients(&sim);
    let lease = RunnerLeaseId(Uuid::now_v7());
    let registration = issuer.mint(&lease.instance_name(), "linux-4x").await.expect("minted");
    let lost = client.launch(&spec(lease, registration)).await;
    assert!(matches!(lost, Err(ProviderError::Failed(_))), "{lost:?}");
    let found = client.find(&lease.instance_name()).await.expect("answered");
    assert!(found.is_some_and(|instance| instance.running), "a failed launch is not proof");
}

#[tokio::test]
async fn a_teardown_is_requested_until_it_is_confirmed() {
    let sim = start(&["--teardown-requested-first"]).await;
    let (client, issuer) = clients(&sim);
    let lease = RunnerLeaseId(Uuid::now_v7());
    let registration = issuer.mint(&lease.instance_name(), "linux-4x").await.expect("minted");
    let launched = client.launch(&spec(lease, registration)).await.expect("launched");
    assert_eq!(client.destroy(&launched.id).await, Ok(Teardown::Requested));
    let still = client.find(&lease.instance_name()).await.expect("answered").expect("listed");
    assert!(still.running, "requested is not gone: {still:?}");
    assert_eq!(client.destroy(&launched.id).await, Ok(Teardown::Stopped));
}

#[tokio::test]
async fn an_unreachable_agent_is_a_failure_to_retry_not_a_refusal() {
    let dir = std::env::temp_dir().join(format!("leasehold-runner-nowhere-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let node = RunnerNodeConfig {
        node: RunnerNodeName::parse("node", "gone").unwrap(),
        url: "http://127.0.0.1:9".into(),
        token: file_token(&dir),
        timeout: Duration::from_secs(2),
    };
    let client = RunnerProviderClient::new(node).unwrap();
    assert!(matches!(client.accepts(TrustClass::Trusted).await, Err(ProviderError::Failed(_))));
    let _ = std::fs::remove_dir_all(dir);
}

/// The token of a one-node file in `dir`.
fn file_token(dir: &std::path::Path) -> leasehold_adapters::providers::ProviderToken {
    let path = dir.join("nodes.json");
    let text = r#"{"issuer": {"url": "http://127.0.0.1:9", "token_file": "token", "runner_group_id": 1},
        "nodes": []}"#;
    std::fs::write(&path, text).unwrap();
    leasehold_adapters::runner_providers::config::load(&path).expect("valid").issuer.token
}
