//! Leasehold's host agent client (`leasehold_adapters::hosts`) against `leasehold backend-sim
//! --host-agent` run as a separate process: the facts of fuse's host agent contract that both
//! hold to (`docs/fuse-host-agent-protocol.md`, "What client and simulator hold to").

use std::time::Duration;

use leasehold_adapters::hosts::wire::CreateVmRequest;
use leasehold_adapters::hosts::{AgentError, AgentTarget, Deleted, HostAgentClient};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

const TOKEN: &str = "fc-agent-token-0123456789abcdef";
const WAIT: Duration = Duration::from_secs(30);

/// The simulated agent, running until dropped.
struct Agent {
    url: String,
    _child: Child,
    _dir: std::path::PathBuf,
}

async fn start_agent(extra: &[&str]) -> Agent {
    let dir = std::env::temp_dir().join(format!("leasehold-agent-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["backend-sim", "--host-agent", "--token-file"])
        .arg(&token_file)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    tokio::time::timeout(WAIT, BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("the agent says where it listens")
        .unwrap();
    let url = line.trim().strip_prefix("listening on ").expect("its first line").to_string();
    Agent { url, _child: child, _dir: dir }
}

fn target(agent: &Agent, token: &str) -> AgentTarget {
    AgentTarget { url: agent.url.clone(), token: token.into() }
}

fn request(name: &str) -> CreateVmRequest {
    CreateVmRequest {
        name: name.into(),
        cpus: 2,
        memory_mb: 2_048,
        storage_gb: 10,
        region: String::new(),
        image: None,
        seed_snapshot: None,
    }
}

#[tokio::test]
async fn a_vm_is_created_read_listed_and_deleted_as_the_contract_says() {
    let agent = start_agent(&[]).await;
    let client = HostAgentClient::new(Duration::from_secs(10)).expect("a client");
    let host = target(&agent, TOKEN);
    let name = "lh-00000000-0000-0000-0000-000000000001";
    // 200 (not 201) with the VM's id (its name, already sanitized) and a host:port URL.
    let created = client.create(&host, &request(name)).await.expect("created");
    assert_eq!(created.vm_id, name);
    assert!(created.url.contains(':') && !created.url.contains("://"), "{}", created.url);
    // A second create of the same name is 409: the caller learns it exists.
    assert_eq!(client.create(&host, &request(name)).await, Err(AgentError::Exists));
    assert_eq!(client.get(&host, name).await.expect("read"), Some(created.clone()));
    let listed = client.list(&host, "lh-").await.expect("listed");
    assert_eq!(listed, [created]);
    assert!(client.list(&host, "other-").await.expect("listed").is_empty(), "an empty list");
    // 204, then 404: already gone, which a destroy takes as done.
    assert_eq!(client.delete(&host, name).await, Ok(Deleted::Destroyed));
    assert_eq!(client.delete(&host, name).await, Ok(Deleted::AlreadyGone));
    assert_eq!(client.get(&host, name).await.expect("read"), None);
    let capacity = client.capacity(&host).await.expect("capacity");
    assert_eq!((capacity.cpus, capacity.arch.as_str()), (16, "amd64"));
}

#[tokio::test]
async fn a_wrong_token_is_refused_on_every_route_and_failures_are_plain_text() {
    let agent = start_agent(&["--fail-boots"]).await;
    let client = HostAgentClient::new(Duration::from_secs(10)).expect("a client");
    let wrong = target(&agent, "not-the-token");
    assert_eq!(client.create(&wrong, &request("lh-x")).await, Err(AgentError::Unauthorized));
    assert_eq!(client.get(&wrong, "lh-x").await, Err(AgentError::Unauthorized));
    assert_eq!(client.list(&wrong, "lh-").await, Err(AgentError::Unauthorized));
    assert_eq!(client.delete(&wrong, "lh-x").await, Err(AgentError::Unauthorized));
    assert_eq!(client.capacity(&wrong).await, Err(AgentError::Unauthorized));
    // A boot that fails is a 500 with a text body (rolled back: nothing is left).
    let host = target(&agent, TOKEN);
    let failed = client.create(&host, &request("lh-y")).await;
    assert!(
        matches!(&failed, Err(AgentError::Failed { status: 500, message }) if message.contains("boot")),
        "{failed:?}"
    );
    assert!(client.list(&host, "lh-").await.expect("listed").is_empty());
    // Nothing listens: unreachable, never a pretend answer.
    let gone = AgentTarget { url: "http://127.0.0.1:9".into(), token: TOKEN.into() };
    assert!(matches!(client.list(&gone, "lh-").await, Err(AgentError::Unreachable(_))));
    assert!(!format!("{host:?}").contains(TOKEN), "a target's Debug never shows the token");
}
