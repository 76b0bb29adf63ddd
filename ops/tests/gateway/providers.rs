//! Rentals through a provider's agent: a real `leasehold serve` whose rental dispatcher and
//! observer call `leasehold backend-sim --provider` over Leasehold's provider protocol
//! (`docs/mercator-protocol.md` §1). A tenant's provision, stop, resume and termination reach
//! the provider once each; the machine's bootstrap carries a working enrollment token that is
//! nowhere in the log; an undeclared operation is never sent; an interruption, an `unknown`
//! look and a provider's refusal are recorded as what they are.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::backend::eventually;
use crate::rented::ENROLLMENT_KEY;
use crate::support::*;

const PROVISION: &str =
    "mutation($input: ProvisionRentalInput!) { provisionRental(input: $input) { id } }";
const RENTAL: &str = "query($id: ID!) { rental(id: $id) { id state generation nodeId interruptibleAllocated observedState stateSince receivedAt } }";
const STOP: &str = "mutation($input: RentalGenerationInput!) { stopRental(input: $input) { id } }";
const RESUME: &str =
    "mutation($input: RentalGenerationInput!) { resumeRental(input: $input) { id } }";
const TERMINATE: &str =
    "mutation($input: RentalGenerationInput!) { terminateRental(input: $input) { id } }";

const TOKEN: &str = "sim-provider-token-0123456789abcdef0123";

pub(crate) const EVERY: &str = r#"{"stop": true, "resume": true, "persistent_disk": true,
    "spot": true, "exact_pricing": true, "idempotent_provision": "operation_key",
    "list_owned": true, "observe_after_terminate": false}"#;

const EPHEMERAL: &str = r#"{"stop": false, "resume": false, "persistent_disk": false,
    "spot": true, "exact_pricing": false, "idempotent_provision": "operation_key",
    "list_owned": true, "observe_after_terminate": true}"#;

/// `leasehold backend-sim --provider`, running until dropped.
pub(crate) struct ProviderSim {
    url: String,
    _child: tokio::process::Child,
}

impl ProviderSim {
    pub(crate) async fn start(dir: &std::path::Path, capabilities: &str, extra: &[&str]) -> Self {
        let token_file = dir.join("sim.token");
        std::fs::write(&token_file, TOKEN).expect("written");
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["backend-sim", "--provider", "--token-file"])
            .arg(&token_file)
            .args(["--capabilities", capabilities])
            .args(extra);
        let (url, child) = leasehold_tests::spawn_listening(command).await;
        Self { url, _child: child }
    }

    async fn get(&self, path: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .expect("the provider answers")
            .json()
            .await
            .expect("JSON")
    }

    pub(crate) async fn count(&self, route: &str) -> u64 {
        self.get("/sim/requests").await[route].as_u64().unwrap_or(0)
    }

    pub(crate) async fn machines(&self) -> Vec<Value> {
        self.get("/sim/machines").await.as_array().cloned().unwrap_or_default()
    }

    async fn poke(&self, what: &str, native_ref: &str) {
        let url = format!("{}/sim/{what}/{native_ref}", self.url);
        let answer = reqwest::Client::new().post(url).send().await.expect("answered");
        assert_eq!(answer.status().as_u16(), 204);
    }
}

/// A server renting through `sim` at `provider`'s URL with `capabilities`, looking at
/// machines every second.
pub(crate) async fn server_renting_from(
    provider: &ProviderSim,
    dir: &std::path::Path,
    caps: &str,
) -> Server {
    server_renting_with(provider, dir, caps, &[]).await
}

/// As [`server_renting_from`], with `extra` arguments.
async fn server_renting_with(
    provider: &ProviderSim,
    dir: &std::path::Path,
    caps: &str,
    extra: &[&str],
) -> Server {
    let file = dir.join("providers.json");
    let text = format!(
        r#"{{"providers": [{{"connection": "sim", "url": "{}", "token_file": "sim.token",
            "timeout_seconds": 5, "capabilities": {caps}}}]}}"#,
        provider.url
    );
    std::fs::write(&file, text).expect("written");
    let key = dir.join("enrollment.key");
    std::fs::write(&key, ENROLLMENT_KEY).expect("written");
    let mut args = vec![
        "--providers-file",
        file.to_str().expect("UTF-8"),
        "--enrollment-key-file",
        key.to_str().expect("UTF-8"),
        "--rental-observe-every",
        "1s",
    ];
    args.extend_from_slice(extra);
    // Logged at info: a failing test shows what the server did.
    Server::start_logging(&args, "info").await
}

pub(crate) fn temp_dir() -> TempDir {
    let dir = std::env::temp_dir().join(format!("lh-prov-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).expect("a directory");
    TempDir(dir)
}

fn provision(key: &str, interruptible: bool) -> Value {
    json!({ "input": {
        "operationKey": key, "connectionId": "sim", "offerId": "gpu-1x",
        "resources": { "cpuMillis": 4000, "memoryMb": 16384, "diskGb": 100, "gpus": 1 },
        "interruptible": interruptible, "maxLifetimeSeconds": 86400,
    }})
}

fn at(rental: &Value, generation: u64, key: &str) -> Value {
    json!({ "input": { "rentalId": rental, "generation": generation, "operationKey": key } })
}

/// Waits (bounded) until the tenant's rental is `state` at `generation`; its read.
pub(crate) async fn rental_in(server: &Server, token: &str, rental: &Value, state: &str) -> Value {
    eventually(&format!("rental {rental} {state}"), || async {
        let read = server.graphql(token, RENTAL, json!({ "id": rental })).await;
        (read["data"]["rental"]["state"] == state).then(|| read["data"]["rental"].clone())
    })
    .await
}

#[tokio::test]
async fn a_rental_is_provisioned_stopped_resumed_and_terminated_through_its_providers_agent() {
    let dir = temp_dir();
    let provider = ProviderSim::start(&dir.0, EVERY, &[]).await;
    let server = server_renting_from(&provider, &dir.0, EVERY).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    // The dispatcher provisions; the observer's look finds it booted.
    let active = rental_in(&server, &acme, &rental, "active").await;
    assert_eq!(active["observedState"], "active", "{active}");
    assert!(active["stateSince"].is_string(), "the provider's own date: {active}");
    let machines = provider.machines().await;
    assert_eq!(machines.len(), 1, "{machines:?}");
    let bootstrap = &machines[0]["bootstrap"];
    assert_eq!(
        (bootstrap["rental_id"].clone(), bootstrap["generation"].clone()),
        (rental.clone(), json!(1))
    );
    assert_eq!(bootstrap["node_id"], active["nodeId"]);
    // Its enrollment token enrolls the node, once; it is in no event.
    let token = bootstrap["enrollment_token"].as_str().expect("a token").to_string();
    let enroll = |token: String| {
        let body = json!({
            "node_id": bootstrap["node_id"], "rental_id": rental, "generation": 1,
            "enrollment_token": token, "agent_version": "1.0.0",
            "facts": { "observed_at": "2026-12-04T09:00:00Z",
                       "host": { "os": "linux", "architecture": "amd64",
                                 "container_runtime": "docker", "runtime_version": "27.1",
                                 "cpu_millis": 4000, "memory_bytes": 17_179_869_184_u64,
                                 "disk_total_bytes": 100_000_000_000_u64,
                                 "disk_free_bytes": 90_000_000_000_u64 } },
        });
        let url = format!("{}/v1/node-agent/enroll", server.base);
        async move { reqwest::Client::new().post(url).json(&body).send().await.expect("answered") }
    };
    assert_eq!(enroll(token.clone()).await.status().as_u16(), 200);
    assert_eq!(enroll(token.clone()).await.status().as_u16(), 401, "single-use");
    // Stop: sent once, confirmed by the look right after it.
    let stopped = server.graphql(&acme, STOP, at(&rental, 1, "s-1")).await;
    assert!(stopped["errors"].is_null(), "{stopped}");
    rental_in(&server, &acme, &rental, "stopped").await;
    // Resume: generation 2, whose node's bootstrap the provider now holds.
    let resumed = server.graphql(&acme, RESUME, at(&rental, 1, "u-1")).await;
    assert!(resumed["errors"].is_null(), "{resumed}");
    let active = rental_in(&server, &acme, &rental, "active").await;
    assert_eq!(active["generation"], 2, "{active}");
    let machines = provider.machines().await;
    assert_eq!(machines[0]["bootstrap"]["generation"], 2);
    assert_eq!(machines[0]["bootstrap"]["node_id"], active["nodeId"]);
    let resumed_token = machines[0]["bootstrap"]["enrollment_token"].as_str().expect("a token");
    assert_ne!(resumed_token, token);
    let resumed_token = resumed_token.to_string();
    // Terminate: this provider forgets terminated machines, so its not-found confirms it.
    let terminated = server.graphql(&acme, TERMINATE, at(&rental, 2, "t-1")).await;
    assert!(terminated["errors"].is_null(), "{terminated}");
    rental_in(&server, &acme, &rental, "terminated").await;
    assert!(provider.machines().await.is_empty());
    for (route, times) in [("provision", 1), ("stop", 1), ("start", 1), ("terminate", 1)] {
        assert_eq!(provider.count(route).await, times, "{route} sent once");
    }
    // No token of any kind, nor the provider's raw JSON, in the log.
    let operator = role_token(leasehold_gateway::Role::Operator, None);
    let log = server
        .graphql(&operator, "{ events(first: 100) { edges { node { type payload } } } }", json!({}))
        .await
        .to_string();
    for secret in [token.as_str(), resumed_token.as_str(), TOKEN, "provider-private"] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
    assert!(log.contains("CapacityTerminated"), "{log}");
}

#[tokio::test]
async fn an_undeclared_stop_is_never_sent_and_unknown_looks_and_interruptions_are_what_they_are() {
    let dir = temp_dir();
    let provider = ProviderSim::start(&dir.0, EPHEMERAL, &[]).await;
    let server = server_renting_from(&provider, &dir.0, EPHEMERAL).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", true)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    let active = rental_in(&server, &acme, &rental, "active").await;
    assert_eq!(active["interruptibleAllocated"], true, "spot as allocated: {active}");
    let stop = server.graphql(&acme, STOP, at(&rental, 1, "s-1")).await;
    assert_eq!(code(&stop), Some("UNSUPPORTED"), "{stop}");
    // An `unknown` look is recorded and moves nothing.
    let native = provider.machines().await[0]["native_ref"].as_str().expect("a ref").to_string();
    provider.poke("unknown", &native).await;
    let unknown = eventually("an unknown look recorded", || async {
        let read = server.graphql(&acme, RENTAL, json!({ "id": rental })).await;
        (read["data"]["rental"]["observedState"] == "unknown")
            .then(|| read["data"]["rental"].clone())
    })
    .await;
    assert_eq!(unknown["state"], "active", "unknown is never a reason to act: {unknown}");
    // The provider reclaims it: terminated, as an interruption, not anyone's stop.
    provider.poke("interrupt", &native).await;
    rental_in(&server, &acme, &rental, "terminated").await;
    let operator = role_token(leasehold_gateway::Role::Operator, None);
    let log = server
        .graphql(&operator, "{ events(first: 100, filter: { streamTypes: [\"rental\"] }) { edges { node { type } } } }", json!({}))
        .await
        .to_string();
    assert!(log.contains("CapacityInterrupted"), "{log}");
    assert_eq!(provider.count("stop").await, 0, "an undeclared operation is never sent");
}

#[tokio::test]
async fn a_provision_refused_for_good_ends_the_rental_and_a_failing_one_is_tried_again() {
    let dir = temp_dir();
    let refusing = ProviderSim::start(&dir.0, EVERY, &["--refuse-provisions"]).await;
    let server = server_renting_from(&refusing, &dir.0, EVERY).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    rental_in(&server, &acme, &rental, "terminated").await;
    assert_eq!(refusing.count("provision").await, 1, "a refusal for good is not retried");
    drop(server);
    let dir = temp_dir();
    let failing = ProviderSim::start(&dir.0, EVERY, &["--fail-provisions"]).await;
    let server = server_renting_from(&failing, &dir.0, EVERY).await;
    let provisioned = server.graphql(&acme, PROVISION, provision("r-2", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    eventually("the provision tried again", || async {
        (failing.count("provision").await >= 2).then_some(())
    })
    .await;
    let read = server.graphql(&acme, RENTAL, json!({ "id": rental })).await;
    assert_eq!(read["data"]["rental"]["state"], "requested", "still asked, nothing allocated");
}

const BLIND: &str = r#"{"stop": true, "resume": true, "persistent_disk": false,
    "spot": false, "exact_pricing": true, "idempotent_provision": "none",
    "list_owned": true, "observe_after_terminate": false}"#;

#[tokio::test]
async fn a_provision_whose_answer_was_lost_is_found_again_never_made_twice() {
    let acme = tenant_token("acme");
    // A provider that lists its capacity is never sent a second provision: its listing holds
    // the machine, marked with the rental's id and ownership token, and that machine is
    // adopted (one that does not deduplicate on the key must list). One that deduplicates
    // and does not list answers the second send with the first receipt.
    for (capabilities, provisions) in [(EVERY, 1), (BLIND, 1), (UNLISTED, 2)] {
        let dir = temp_dir();
        let provider =
            ProviderSim::start(&dir.0, capabilities, &["--lose-provision-answers"]).await;
        let server = server_renting_from(&provider, &dir.0, capabilities).await;
        let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
        let rental = data(&provisioned)["provisionRental"]["id"].clone();
        rental_in(&server, &acme, &rental, "active").await;
        let machines = provider.machines().await;
        assert_eq!(machines.len(), 1, "one machine: {machines:?}");
        assert_eq!(provider.count("provision").await, provisions, "{capabilities}");
        let listed = provider.count("owned").await;
        assert_eq!(listed > 0, provisions == 1, "listed where the provider lists");
    }
}

const UNLISTED: &str = r#"{"stop": true, "resume": true, "persistent_disk": false,
    "spot": false, "exact_pricing": true, "idempotent_provision": "operation_key",
    "list_owned": false, "observe_after_terminate": false}"#;

#[tokio::test]
async fn a_termination_asked_before_a_lost_receipt_ends_the_one_machine_the_provision_made() {
    let dir = temp_dir();
    let provider = ProviderSim::start(&dir.0, UNLISTED, &["--lose-provision-answers"]).await;
    let server = server_renting_from(&provider, &dir.0, UNLISTED).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    // The first send's answer is lost; the tenant terminates before any receipt.
    eventually("the first provision sent", || async {
        (provider.count("provision").await >= 1).then_some(())
    })
    .await;
    let terminated = server.graphql(&acme, TERMINATE, at(&rental, 1, "t-1")).await;
    assert!(terminated["errors"].is_null(), "{terminated}");
    // The provision is sent again under its own key: the provider's first machine answers
    // it, and that machine is the one terminated. None is left behind.
    rental_in(&server, &acme, &rental, "terminated").await;
    assert!(provider.machines().await.is_empty(), "{:?}", provider.machines().await);
    assert_eq!(provider.count("provision").await, 2);
}

#[tokio::test]
async fn a_run_on_rented_capacity_runs_to_its_outcome_on_the_machines_node_agent() {
    use crate::rented::{RUN, SUBMIT};
    let dir = temp_dir();
    let nodes = ["--nodes", "--node-beat-ms", "300", "--node-run-ms", "300"];
    let provider = ProviderSim::start(&dir.0, EVERY, &nodes).await;
    let server = server_renting_from(&provider, &dir.0, EVERY).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    rental_in(&server, &acme, &rental, "active").await;
    // The machine's node agent enrolled with the bootstrap's token.
    let ready = |generation: u64| {
        let (server, acme, rental) = (&server, &acme, &rental);
        async move {
            eventually(&format!("node of generation {generation} ready"), || async {
                let read = server.graphql(acme, NODE_STATE, json!({ "id": rental })).await;
                let rental = &read["data"]["rental"];
                (rental["nodeState"] == "ready" && rental["generation"] == generation)
                    .then(|| rental.clone())
            })
            .await
        }
    };
    let enrolled = ready(1).await;
    // Its facts came with its enrollment; their age is from Leasehold's receipt (a heartbeat
    // with the same facts is recorded at most every 30 s).
    let age = enrolled["factsAgeSeconds"].as_i64().expect("facts were reported");
    assert!((0..120).contains(&age), "{enrolled}");
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "c".repeat(64)), "maxRuntimeSeconds": 600,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit).await;
    let run = data(&submitted)["submitRun"]["id"].clone();
    eventually("the run succeeded on the node", || async {
        let read = server.graphql(&acme, RUN, json!({ "id": run })).await;
        (read["data"]["run"]["outcome"] == "succeeded").then_some(())
    })
    .await;
    // Stopped, its node goes with it; resumed, the new generation's node enrolls.
    let stopped = server.graphql(&acme, STOP, at(&rental, 1, "s-1")).await;
    assert!(stopped["errors"].is_null(), "{stopped}");
    rental_in(&server, &acme, &rental, "stopped").await;
    let resumed = server.graphql(&acme, RESUME, at(&rental, 1, "u-1")).await;
    assert!(resumed["errors"].is_null(), "{resumed}");
    ready(2).await;
    let nodes = server
        .graphql(
            &acme,
            "query($id: ID!) { rentalNodes(rentalId: $id) { generation state } }",
            json!({ "id": rental }),
        )
        .await;
    let states: Vec<(Value, Value)> = data(&nodes)["rentalNodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|node| (node["generation"].clone(), node["state"].clone()))
        .collect();
    assert!(states.contains(&(json!(1), json!("retired"))), "{states:?}");
}

const NODE_STATE: &str =
    "query($id: ID!) { rental(id: $id) { generation nodeState factsAgeSeconds } }";

#[tokio::test]
async fn a_launch_lost_on_its_way_is_relaunched_only_after_the_nodes_reconciliation_says_so() {
    use crate::rented::{RUN, SUBMIT};
    let dir = temp_dir();
    let nodes =
        ["--nodes", "--node-beat-ms", "300", "--node-run-ms", "200", "--node-drop-first-launch"];
    let provider = ProviderSim::start(&dir.0, EVERY, &nodes).await;
    let quick = ["--rented-sweep-every", "1s", "--launch-answer-within", "1s"];
    let server = server_renting_with(&provider, &dir.0, EVERY, &quick).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    rental_in(&server, &acme, &rental, "active").await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "d".repeat(64)), "maxRuntimeSeconds": 600,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit).await;
    let run = data(&submitted)["submitRun"]["id"].clone();
    let done = eventually("the run succeeded on its second attempt", || async {
        let read = server.graphql(&acme, RUN, json!({ "id": run })).await;
        (read["data"]["run"]["outcome"] == "succeeded").then(|| read["data"]["run"].clone())
    })
    .await;
    assert_eq!(done["attemptsCount"].as_array().map(Vec::len), Some(2), "{done}");
    // In the run's stream: the lost answer, then the node's account, and only then the
    // second attempt.
    let operator = role_token(leasehold_gateway::Role::Operator, None);
    let page = server
        .graphql(&operator, "{ events(first: 100, filter: { streamTypes: [\"run\"] }) { edges { node { type } } } }", json!({}))
        .await;
    let types: Vec<String> = data(&page)["events"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|edge| edge["node"]["type"].as_str().unwrap_or_default().to_string())
        .collect();
    let at = |name: &str| types.iter().position(|t| t == name).unwrap_or(usize::MAX);
    let second = types.iter().enumerate().filter(|(_, t)| *t == "RunAttemptCreated").nth(1);
    let second = second.map_or(usize::MAX, |(i, _)| i);
    assert!(at("RunLaunchIndeterminate") < at("RunLaunchNotApplied"), "{types:?}");
    assert!(at("RunLaunchNotApplied") < second && second != usize::MAX, "{types:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silenced_node_is_lost_past_its_lease_and_its_run_reads_unobserved_not_failed() {
    use crate::rented::SUBMIT;
    const RUN_SEEN: &str =
        "query($id: ID!) { run(id: $id) { status outcome nodeState unobserved } }";
    let dir = temp_dir();
    // The node's workload runs for an hour: only the node's silence can change the run.
    let nodes = ["--nodes", "--node-beat-ms", "300", "--node-run-ms", "3600000"];
    let provider = ProviderSim::start(&dir.0, EVERY, &nodes).await;
    let sweep = ["--rented-sweep-every", "1s"];
    let server = server_renting_with(&provider, &dir.0, EVERY, &sweep).await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision("r-1", false)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    rental_in(&server, &acme, &rental, "active").await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "c".repeat(64)), "maxRuntimeSeconds": 7200,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit).await;
    let run = data(&submitted)["submitRun"]["id"].clone();
    let seen = || async { server.graphql(&acme, RUN_SEEN, json!({ "id": run })).await };
    eventually("the run running on its node", || async {
        let read = seen().await;
        (read["data"]["run"]["status"] == "running").then_some(())
    })
    .await;
    let read = seen().await;
    assert_eq!(data(&read)["run"]["unobserved"], false, "{read}");
    // The node falls silent: once its 90 s lease has passed without a beat, the sweep loses
    // it, and its run reads unobserved, not failed.
    let native = provider.machines().await[0]["native_ref"].as_str().expect("a ref").to_string();
    provider.poke("silence", &native).await;
    let lost = tokio::time::timeout(std::time::Duration::from_secs(240), async {
        loop {
            let read = seen().await;
            if read["data"]["run"]["nodeState"] == "lost" {
                return read;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        let logs = server.logs();
        let tail: Vec<&str> = logs.lines().rev().take(60).collect();
        panic!(
            "the node was not lost within its lease and a sweep; the server's log, last first:\n{}",
            tail.join("\n")
        )
    });
    let lost = data(&lost)["run"].clone();
    assert_eq!(
        (&lost["status"], &lost["outcome"], &lost["unobserved"]),
        (&json!("running"), &Value::Null, &json!(true)),
        "{lost}"
    );
}
