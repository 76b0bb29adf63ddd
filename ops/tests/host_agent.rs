//! Leasehold's host agent client (`leasehold_adapters::hosts`) against `leasehold backend-sim
//! --host-agent` run as a separate process: the facts of fuse's host agent contract that both
//! hold to (`docs/fuse-host-agent-protocol.md`, "What client and simulator hold to").

use std::time::Duration;

use leasehold_adapters::hosts::grant::{self, GRANT_HEADER};
use leasehold_adapters::hosts::wire::{
    ArtifactPullRequest, CreateVmRequest, ExportRequest, ForkVmRequest, RestoreRequest,
    SnapshotRequest,
};
use leasehold_adapters::hosts::{AgentError, AgentTarget, Deleted, Exported, HostAgentClient};
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
    start_agent_with(TOKEN, extra).await
}

async fn start_agent_with(token: &str, extra: &[&str]) -> Agent {
    let dir = std::env::temp_dir().join(format!("leasehold-agent-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
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

fn fork_of(name: &str, snapshot_id: &str) -> ForkVmRequest {
    ForkVmRequest {
        name: name.into(),
        snapshot_id: snapshot_id.into(),
        cpus: 2,
        memory_mb: 2_048,
        storage_gb: 0,
        region: String::new(),
    }
}

#[tokio::test]
async fn a_snapshot_forks_on_its_host_and_moves_to_another_only_with_a_grant_of_its_hosts_token() {
    const OTHER: &str = "fc-agent-token-of-the-other-host";
    let (a, b) = (start_agent(&[]).await, start_agent_with(OTHER, &[]).await);
    let client = HostAgentClient::new(Duration::from_secs(10)).expect("a client");
    let (host_a, host_b) = (target(&a, TOKEN), target(&b, OTHER));
    let source = "lh-00000000-0000-0000-0000-00000000000a";
    client.create(&host_a, &request(source)).await.expect("created");
    let disk = SnapshotRequest { comment: "a note".into(), live: false };
    let taken = client.snapshot(&host_a, source, &disk).await.expect("taken");
    // The agent's id, the rootfs's sha256, the kind as taken.
    assert!(taken.snapshot_id.starts_with("snap-"), "{}", taken.snapshot_id);
    assert_eq!(taken.digest.len(), 64);
    assert!(taken.digest.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    assert_eq!(taken.kind, "disk");
    assert_eq!(
        client.snapshot(&host_a, "lh-missing", &disk).await,
        Err(AgentError::NotFound),
        "no such VM"
    );
    // A fork is a new VM on the same host; the source keeps running.
    let fork = "lh-00000000-0000-0000-0000-00000000000b";
    let forked = client.fork(&host_a, source, &fork_of(fork, &taken.snapshot_id)).await;
    assert_eq!(forked.expect("forked").vm_id, fork);
    assert!(client.get(&host_a, source).await.expect("read").is_some());
    let again = client.fork(&host_a, source, &fork_of(fork, &taken.snapshot_id)).await;
    assert_eq!(again, Err(AgentError::Exists));
    let unknown = client.fork(&host_a, source, &fork_of("lh-c", "snap-0-000000")).await;
    assert_eq!(unknown, Err(AgentError::NotFound));
    let no_source = client.fork(&host_a, "lh-missing", &fork_of("lh-c", &taken.snapshot_id)).await;
    assert_eq!(no_source, Err(AgentError::NotFound));
    // B pulls A's artifact with a grant minted with A's token; with B's own, A refuses and B
    // answers 422.
    let expiry = chrono::Utc::now().timestamp() + 300;
    let pull = |token: &str| ArtifactPullRequest {
        peer_url: a.url.clone(),
        grant: grant::mint(token, &taken.digest, expiry, [3; 16]),
        snapshot_id: "snap-moved".into(),
    };
    let refused = client.pull_artifact(&host_b, &taken.digest, &pull(OTHER)).await;
    assert!(matches!(refused, Err(AgentError::Refused { status: 422, .. })), "{refused:?}");
    let pulled = client.pull_artifact(&host_b, &taken.digest, &pull(TOKEN)).await.expect("pulled");
    assert_eq!(
        (pulled.snapshot_id.as_str(), pulled.digest.as_str()),
        ("snap-moved", taken.digest.as_str())
    );
    // Booted on B from the pulled artifact; an unknown seed is not found.
    let mut seeded = request("lh-00000000-0000-0000-0000-00000000000d");
    seeded.seed_snapshot = Some("snap-moved".into());
    client.create(&host_b, &seeded).await.expect("booted from the pulled snapshot");
    let mut unknown = request("lh-e");
    unknown.seed_snapshot = Some("snap-nowhere".into());
    assert_eq!(client.create(&host_b, &unknown).await, Err(AgentError::NotFound));
    // The artifact route wants the grant, not the bearer token: the same 403 for every failure.
    let http = reqwest::Client::new();
    let artifact = format!("{}/v1/artifacts/{}", a.url, taken.digest);
    let bearer = http.get(&artifact).bearer_auth(TOKEN).send().await.expect("answered");
    assert_eq!(bearer.status(), 403);
    let expired = grant::mint(TOKEN, &taken.digest, 1, [3; 16]);
    let late = http.get(&artifact).header(GRANT_HEADER, expired).send().await.expect("answered");
    assert_eq!(
        (late.status().as_u16(), late.text().await.expect("text").as_str()),
        (403, "forbidden")
    );
}

#[tokio::test]
async fn a_snapshot_restores_in_place_and_its_deletion_is_answered_not_found() {
    let agent = start_agent(&[]).await;
    let (client, host) = (HostAgentClient::new(WAIT).expect("a client"), target(&agent, TOKEN));
    let vm = "lh-00000000-0000-0000-0000-00000000000d";
    client.create(&host, &request(vm)).await.expect("created");
    let live = SnapshotRequest { comment: String::new(), live: true };
    let taken = client.snapshot(&host, vm, &live).await.expect("taken");
    assert_eq!(taken.kind, "live");
    let disk = SnapshotRequest { comment: String::new(), live: false };
    let plain = client.snapshot(&host, vm, &disk).await.expect("taken");
    assert!(taken.size_bytes > plain.size_bytes, "a live snapshot's size counts its memory");
    let restore = RestoreRequest { snapshot_id: taken.snapshot_id.clone() };
    client.restore(&host, vm, &restore).await.expect("restored in place");
    let unknown = RestoreRequest { snapshot_id: "snap-0-000000".into() };
    assert_eq!(client.restore(&host, vm, &unknown).await, Err(AgentError::NotFound));
    assert_eq!(client.restore(&host, "lh-missing", &restore).await, Err(AgentError::NotFound));
    let bad = RestoreRequest { snapshot_id: String::new() };
    assert!(matches!(client.restore(&host, vm, &bad).await, Err(AgentError::Refused { .. })));
    // fuse's agent has no route to delete a snapshot: every deletion is answered 404.
    let deleted = client.delete_snapshot(&host, vm, &taken.snapshot_id).await;
    assert_eq!(deleted, Ok(Deleted::AlreadyGone));
}

#[tokio::test]
async fn an_export_goes_to_leaseholds_own_route_and_an_unknown_snapshot_is_not_found() {
    let agent = start_agent(&[]).await;
    let (client, host) = (HostAgentClient::new(WAIT).expect("a client"), target(&agent, TOKEN));
    let vm = "lh-00000000-0000-0000-0000-00000000000e";
    client.create(&host, &request(vm)).await.expect("created");
    let disk = SnapshotRequest { comment: String::new(), live: false };
    let taken = client.snapshot(&host, vm, &disk).await.expect("taken");
    let export =
        ExportRequest { destination: "s3://backups/snap".into(), operation_id: Uuid::now_v7() };
    let written = client.export_snapshot(&host, (vm, &taken.snapshot_id), &export).await;
    assert_eq!(written, Ok(Exported::Written));
    let unknown = client.export_snapshot(&host, (vm, "snap-0-000000"), &export).await;
    assert_eq!(unknown, Err(AgentError::NotFound));
    let wrong = target(&agent, "not-the-token");
    let refused = client.export_snapshot(&wrong, (vm, &taken.snapshot_id), &export).await;
    assert_eq!(refused, Err(AgentError::Unauthorized));
}
