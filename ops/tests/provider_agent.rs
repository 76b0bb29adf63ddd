//! Leasehold's provider client (`leasehold_adapters::providers`) against `leasehold
//! backend-sim --provider` run as a separate process: the facts of the provider protocol
//! (`docs/mercator-protocol.md` §1) that both hold to, route by route, with the routes
//! themselves read from the note's table.

use std::path::{Path, PathBuf};

use leasehold_adapters::providers::wire::{
    CapacityCommand, CapacityRef, NodeBootstrap, OwnershipQuery, ProvisionCommand,
};
use leasehold_adapters::providers::{ProviderClient, ProviderError, config};
use leasehold_domain::rental::{CapacityState, Resources};
use tokio::process::{Child, Command};
use uuid::Uuid;

const TOKEN: &str = "a-provider-token-of-at-least-32-bytes-0123";

const EVERY: &str = r#"{"stop": true, "resume": true, "persistent_disk": true, "spot": true,
    "exact_pricing": true, "idempotent_provision": "operation_key", "list_owned": true,
    "observe_after_terminate": false}"#;

const NO_RESUME: &str = r#"{"stop": true, "resume": false, "persistent_disk": false,
    "spot": false, "exact_pricing": true, "idempotent_provision": "operation_key",
    "list_owned": true, "observe_after_terminate": false}"#;

/// The simulated provider, running until dropped.
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

async fn start(capabilities: &str, extra: &[&str]) -> Sim {
    let dir = std::env::temp_dir().join(format!("leasehold-provider-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(["backend-sim", "--provider", "--token-file"])
        .arg(&token_file)
        .args(["--capabilities", capabilities])
        .args(extra);
    let (url, child) = leasehold_tests::spawn_listening(command).await;
    Sim { url, dir, _child: child }
}

/// A client of `sim` through a providers file declaring `capabilities` (it may declare
/// what the simulator does not).
fn client(sim: &Sim, capabilities: &str) -> ProviderClient {
    client_at(&sim.dir, &sim.url, capabilities)
}

fn client_at(dir: &Path, url: &str, capabilities: &str) -> ProviderClient {
    let file = dir.join(format!("providers-{}.json", Uuid::now_v7()));
    let text = format!(
        r#"{{"providers": [{{"connection": "sim", "url": "{url}", "token_file": "token",
            "timeout_seconds": 5, "capabilities": {capabilities}}}]}}"#
    );
    std::fs::write(&file, text).unwrap();
    let loaded = config::load(&file).expect("a valid providers file");
    ProviderClient::new(loaded.into_iter().next().expect("one")).expect("a client")
}

fn provision(rental: Uuid, key: &str) -> ProvisionCommand {
    ProvisionCommand {
        workspace_id: "acme".into(),
        connection_id: "sim".into(),
        operation_key: key.into(),
        request_hash: format!("hash-of-{key}"),
        rental_id: rental,
        generation: 1,
        ownership_token: format!("mark-{rental}"),
        offer_snapshot_id: "gpu-1x".into(),
        resources: Resources { cpu_millis: 4000, memory_mb: 16384, disk_gb: 100, gpus: 1 },
        bootstrap: NodeBootstrap {
            control_plane_url: "http://127.0.0.1:8080".into(),
            node_id: Uuid::now_v7(),
            rental_id: rental,
            generation: 1,
            enrollment_token: "single-use".into(),
            agent_version: "1".into(),
        },
        interruptible: false,
        max_lifetime_seconds: 3600,
    }
}

fn capacity(rental: Uuid, native_ref: &str) -> CapacityRef {
    CapacityRef {
        workspace_id: "acme".into(),
        connection_id: "sim".into(),
        rental_id: rental,
        native_ref: native_ref.into(),
        ownership_token: format!("mark-{rental}"),
    }
}

fn command(rental: Uuid, native_ref: &str, key: &str, generation: u64) -> CapacityCommand {
    CapacityCommand {
        capacity: capacity(rental, native_ref),
        operation_key: key.into(),
        request_hash: format!("hash-of-{key}"),
        generation,
        bootstrap: None,
    }
}

async fn count(sim: &Sim, route: &str) -> u64 {
    let counts: serde_json::Value =
        reqwest::get(format!("{}/sim/requests", sim.url)).await.unwrap().json().await.unwrap();
    counts[route].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn every_documented_route_is_served_behind_the_connections_token() {
    let sim = start(EVERY, &[]).await;
    let routes: Vec<String> = leasehold_tests::documented_routes("/v1/capacity/")
        .into_iter()
        .map(|route| format!("/v1/capacity/{route}"))
        .collect();
    assert_eq!(routes.len(), 6, "{routes:?}");
    let http = reqwest::Client::new();
    for route in routes {
        let url = format!("{}{route}", sim.url);
        let anonymous = http.post(&url).body("{}").send().await.unwrap();
        assert_eq!(anonymous.status().as_u16(), 401, "{route} without the token");
        let wrong = http.post(&url).bearer_auth("not-the-token").body("{}").send().await.unwrap();
        assert_eq!(wrong.status().as_u16(), 401, "{route} with another token");
        let malformed = http.post(&url).bearer_auth(TOKEN).body("{").send().await.unwrap();
        assert_eq!(malformed.status().as_u16(), 400, "{route} is served");
        let body: serde_json::Value = malformed.json().await.unwrap();
        assert_eq!(body["code"], "INVALID_REQUEST", "{route}: {body}");
    }
}

#[tokio::test]
async fn a_machines_life_as_client_and_simulator_both_speak_it() {
    let sim = start(EVERY, &[]).await;
    let client = client(&sim, EVERY);
    let rental = Uuid::now_v7();
    // Provision; the same key and request again is the same receipt, marked duplicate; the
    // same key with another request is a refusal for good.
    let receipt = client.provision(&provision(rental, "p-1")).await.expect("accepted");
    assert_eq!((receipt.state, receipt.duplicate), (CapacityState::Starting, false));
    let again = client.provision(&provision(rental, "p-1")).await.expect("accepted");
    assert_eq!((again.native_ref.clone(), again.duplicate), (receipt.native_ref.clone(), true));
    let mut other = provision(rental, "p-1");
    other.request_hash = "another".into();
    let conflict = client.provision(&other).await.expect_err("refused");
    assert!(
        matches!(&conflict, ProviderError::Refused { status: 409, code, .. } if code == "CONFLICT"),
        "{conflict:?}"
    );
    let native = receipt.native_ref.as_str().to_string();
    // Looks: dated by the provider; an unknown machine is not found.
    let look = client.observe(&capacity(rental, &native)).await.expect("a look");
    assert_eq!(look.state, CapacityState::Active);
    assert!(look.state_since.is_some(), "the provider dates its states");
    let nowhere = client.observe(&capacity(Uuid::now_v7(), "i-none")).await;
    assert_eq!(nowhere, Err(ProviderError::NotFound));
    // Owned capacity carries the mark.
    let owned = client.owned(&OwnershipQuery::default()).await.expect("listed");
    assert_eq!(owned.len(), 1);
    assert_eq!(owned[0].rental_id, Some(rental));
    assert_eq!(owned[0].ownership_token.as_deref(), Some(format!("mark-{rental}").as_str()));
    // Stop; then a start stamped with generation 2 with its bootstrap; a stop stamped with
    // the superseded generation 1 is fenced.
    let stop = client.stop(&command(rental, &native, "s-1", 1)).await.expect("stopping");
    assert_eq!(stop.state, CapacityState::Stopping);
    let look = client.observe(&capacity(rental, &native)).await.expect("a look");
    assert_eq!(look.state, CapacityState::Stopped);
    let mut start = command(rental, &native, "u-1", 2);
    start.bootstrap = Some(provision(rental, "x").bootstrap);
    assert_eq!(client.start(&start).await.expect("starting").state, CapacityState::Starting);
    let stale = client.stop(&command(rental, &native, "s-2", 1)).await;
    assert_eq!(stale, Err(ProviderError::Fenced));
    // Terminate: this provider does not keep terminated capacity, so it is then not found.
    let gone = client.terminate(&command(rental, &native, "t-1", 2)).await.expect("taken");
    assert_eq!(gone.state, CapacityState::Terminated);
    let look = client.observe(&capacity(rental, &native)).await;
    assert_eq!(look, Err(ProviderError::NotFound));
    let again = client.terminate(&command(rental, &native, "t-2", 2)).await;
    assert_eq!(again, Err(ProviderError::NotFound));
}

#[tokio::test]
async fn an_undeclared_operation_is_refused_before_sending_and_answered_501_if_sent() {
    let sim = start(NO_RESUME, &[]).await;
    let rental = Uuid::now_v7();
    let honest = client(&sim, NO_RESUME);
    let receipt = honest.provision(&provision(rental, "p-1")).await.expect("accepted");
    let native = receipt.native_ref.as_str().to_string();
    let start = command(rental, &native, "u-1", 2);
    assert_eq!(honest.start(&start).await, Err(ProviderError::Unsupported("resume")));
    assert_eq!(count(&sim, "start").await, 0, "never sent");
    // A client told the provider resumes (a wrong providers file) gets the provider's 501.
    let misinformed = client(&sim, EVERY);
    let answer = misinformed.start(&start).await;
    assert!(matches!(answer, Err(ProviderError::Unsupported(_))), "{answer:?}");
    assert_eq!(count(&sim, "start").await, 1);
}

#[tokio::test]
async fn a_refusal_for_good_and_a_failure_are_told_apart() {
    let refusing = start(EVERY, &["--refuse-provisions"]).await;
    let refused = client(&refusing, EVERY).provision(&provision(Uuid::now_v7(), "p-1")).await;
    assert!(
        matches!(&refused, Err(ProviderError::Refused { status: 400, code }) if code == "NO_CAPACITY"),
        "{refused:?}"
    );
    // The simulator echoes the request's enrollment token in its message, as a careless
    // provider would: the client keeps only the status and the code.
    let kept = format!("{refused:?} {}", refused.clone().expect_err("refused"));
    assert!(!kept.contains("single-use"), "{kept}");
    let failing = start(EVERY, &["--fail-provisions"]).await;
    let failed = client(&failing, EVERY).provision(&provision(Uuid::now_v7(), "p-1")).await;
    assert!(matches!(failed, Err(ProviderError::Failed(_))), "{failed:?}");
    // Nobody listening: a failure, tried again; the token is in no error's text.
    let dir = std::env::temp_dir().join(format!("leasehold-provider-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let nowhere = client_at(&dir, "http://127.0.0.1:9", EVERY);
    let unreachable = nowhere.provision(&provision(Uuid::now_v7(), "p-1")).await;
    assert!(matches!(&unreachable, Err(ProviderError::Failed(_))), "{unreachable:?}");
    assert!(!format!("{unreachable:?}").contains(TOKEN));
    let _ = std::fs::remove_dir_all(dir);
}
