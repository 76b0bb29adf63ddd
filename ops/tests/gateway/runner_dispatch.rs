//! Runner leases launched and torn down through a real `leasehold serve` and `leasehold
//! backend-sim --runner-provider` (a runner node's provider agent and a registration issuer),
//! each a separate process: an assigned lease is launched on a node that accepts its trust
//! class, its node's agent reports it online and busy under its epoch, its release destroys
//! its instance and gives its capacity back once confirmed; a lost launch answer is found by
//! name before anything is launched again; no registration is minted for a trust class no
//! node accepts; no byte of a runner's registration is anywhere but in the launch; and an
//! instance a node runs for a lease that never was is destroyed, while others are left alone.

use std::path::Path;

use chrono::TimeDelta;
use leasehold_domain::runner::RunnerNodeName;
use leasehold_gateway::Role;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::backend::eventually;
use crate::runners::ASSIGN;
use crate::support::*;

const TOKEN: &str = "a-runner-agent-token-of-at-least-32-bytes";
const LEASE: &str = "query($id: ID!) { runnerLease(id: $id) { id phase outcome teardown node epoch instanceId failureReason } }";
pub(crate) const REGISTER: &str =
    "mutation($input: RegisterRunnerNodeInput!) { registerRunnerNode(input: $input) { id } }";
const NODE_LEASES: &str = "{ nodeRunnerLeases { id instanceName epoch phase } }";
const PHASE: &str = "mutation($input: RunnerReportInput!, $phase: String!) { reportRunnerPhase(input: $input, phase: $phase) { id events { type } } }";
const RELEASE: &str =
    "mutation($input: ReleaseRunnerLeaseInput!) { releaseRunnerLease(input: $input) { id } }";

/// The simulated runner provider and issuer, running until dropped.
pub(crate) struct RunnerSim {
    url: String,
    http: reqwest::Client,
    _child: Child,
}

impl RunnerSim {
    async fn start(dir: &Path, faults: &[&str]) -> RunnerSim {
        let token_file = dir.join("runner.token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).expect("written");
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command.args(["backend-sim", "--runner-provider", "--token-file"]).arg(&token_file);
        command.args(faults);
        let (url, child) = leasehold_tests::spawn_listening(command).await;
        RunnerSim { url, http: reqwest::Client::new(), _child: child }
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        let answer = self.http.get(format!("{}{path}", self.url)).send().await.expect("answered");
        answer.json().await.expect("JSON")
    }
}

/// A server launching runner leases on `sim` as the node `docker-1`, and the sim.
pub(crate) async fn dispatching(faults: &[&str]) -> (Server, RunnerSim, TempDir) {
    dispatching_logging(faults, "warn").await
}

/// [`dispatching`], the server logging at `level`.
async fn dispatching_logging(faults: &[&str], level: &str) -> (Server, RunnerSim, TempDir) {
    let dir = TempDir(std::env::temp_dir().join(format!("lh-runners-{}", uuid::Uuid::now_v7())));
    std::fs::create_dir_all(&dir.0).expect("a directory");
    let sim = RunnerSim::start(&dir.0, faults).await;
    let file = dir.0.join("runner-nodes.json");
    let text = json!({
        "issuer": { "url": format!("{}/orgs/acme/actions/runners/generate-jitconfig", sim.url),
                    "token_file": "runner.token", "runner_group_id": 1, "timeout_seconds": 5 },
        "nodes": [{ "node": "docker-1", "url": sim.url, "token_file": "runner.token",
                    "timeout_seconds": 5 }],
    });
    std::fs::write(&file, text.to_string()).expect("written");
    let file = file.to_str().expect("UTF-8");
    let args = ["--runner-nodes-file", file, "--runner-orphans-every", "1s"];
    let server = Server::start_logging(&args, level).await;
    let agent = node_agent();
    let register = json!({ "input": {
        "operationKey": "reg-1", "provider": "docker", "guestOs": ["linux"],
        "accepts": ["trusted", "untrusted"], "vcpu": 64, "memoryMb": 262144, "inventory": [] } });
    data(&server.graphql(&agent, REGISTER, register).await);
    (server, sim, dir)
}

pub(crate) fn node_agent() -> String {
    let node = RunnerNodeName::parse("node", "docker-1").expect("valid");
    secret().mint_runner_node_agent("runner-docker-1", &node, TimeDelta::hours(1))
}

/// `token`'s lease `key`, assigned a job.
async fn assigned(server: &Server, token: &str, key: &str, trust: &str) -> Value {
    let mut input = crate::runners::request_input(key, 600);
    input["input"]["trust"] = json!(trust);
    let requested = server.graphql(token, crate::runners::REQUEST, input).await;
    let lease = data(&requested)["requestRunnerLease"]["id"].clone();
    let job = uuid::Uuid::now_v7().to_string();
    let assign = json!({ "input": {
        "leaseId": lease, "operationKey": format!("{key}-assign"), "requestId": job, "runId": 1 } });
    data(&server.graphql(token, ASSIGN, assign).await);
    lease
}

/// The lease as the operator reads it once `ready` holds of it.
pub(crate) async fn operator_reads(
    server: &Server,
    lease: &Value,
    what: &str,
    ready: fn(&Value) -> bool,
) -> Value {
    let operator = role_token(Role::Operator, None);
    eventually(&format!("runner lease {lease}: {what}"), || async {
        let read = server.graphql(&operator, LEASE, json!({ "id": lease })).await;
        let read = read["data"]["runnerLease"].clone();
        ready(&read).then_some(read)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_lease_is_launched_reported_and_torn_down_without_its_registration_kept() {
    // Every log line, down to trace, is looked through for the registration.
    let (server, sim, _dir) = dispatching_logging(&["--teardown-requested-first"], "trace").await;
    let acme = tenant_token("acme");
    let lease = assigned(&server, &acme, "r-1", "trusted").await;
    let launched =
        operator_reads(&server, &lease, "launched", |read| !read["instanceId"].is_null()).await;
    assert_eq!(
        (launched["phase"].as_str(), launched["node"].as_str()),
        (Some("launching"), Some("docker-1"))
    );
    // The node's agent reads its lease's epoch and reports it online, then busy.
    let agent = node_agent();
    let mine = eventually("the node's agent sees its lease", || async {
        let mine = server.graphql(&agent, NODE_LEASES, json!({})).await;
        let leases = mine["data"]["nodeRunnerLeases"].as_array().cloned().unwrap_or_default();
        leases.into_iter().find(|held| held["id"] == lease)
    })
    .await;
    assert_eq!(
        mine["instanceName"],
        format!("billet-{}", lease.as_str().unwrap().replace('-', ""))
    );
    for phase in ["online", "busy"] {
        let input = json!({ "input": { "leaseId": lease, "epoch": mine["epoch"], "operationKey": format!("p-{phase}") }, "phase": phase });
        let reported = server.graphql(&agent, PHASE, input).await;
        assert_eq!(
            data(&reported)["reportRunnerPhase"]["events"],
            json!([{ "type": "RunnerAdvanced" }])
        );
    }
    let stale = json!({ "input": { "leaseId": lease, "epoch": 99, "operationKey": "p-stale" }, "phase": "custody" });
    assert_eq!(code(&server.graphql(&agent, PHASE, stale).await), Some("FENCED"));
    // Released: its instance destroyed, charged until the destroy is confirmed.
    let release =
        json!({ "input": { "leaseId": lease, "operationKey": "x-1", "outcome": "done" } });
    data(&server.graphql(&acme, RELEASE, release).await);
    let done = operator_reads(&server, &lease, "torn down", |read| read["phase"] == "done").await;
    assert_eq!(
        (done["outcome"].as_str(), done["teardown"].as_str()),
        (Some("done"), Some("stopped"))
    );
    let capacity = server.graphql(&acme, "{ runnerCapacity { vcpu } }", json!({})).await;
    assert_eq!(data(&capacity)["runnerCapacity"]["vcpu"], 0);
    let instances = sim.get("/sim/instances").await;
    assert_eq!(instances.as_array().map(Vec::len), Some(1), "{instances}");
    assert_eq!(
        (instances[0]["launches"].as_u64(), instances[0]["terminal"].as_bool()),
        (Some(1), Some(true))
    );
    assert_eq!(instances[0]["destroys"], 2, "requested first, then stopped: {instances}");
    // No byte of the registration anywhere but in the launch: events, rows, logs, answers.
    let registrations = sim.get("/sim/registrations").await;
    let registration = registrations[0].as_str().expect("one minted").to_string();
    let auditor = role_token(Role::Auditor, None);
    let events = server
        .graphql(&auditor, "{ events(first: 100) { edges { node { type payload } } } }", json!({}))
        .await;
    let answers = [events.to_string(), launched.to_string(), done.to_string(), mine.to_string()];
    for (what, text) in [("the log's events", &answers[0]), ("the reads", &answers[1..].concat())] {
        assert!(!text.contains(&registration), "{what} hold the registration");
    }
    assert!(!every_row(&server).await.contains(&registration), "a row holds the registration");
    assert!(!server.logs().contains(&registration), "a log line holds the registration");
}

/// Every row of every table of the server's database, as text.
async fn every_row(server: &Server) -> String {
    let client = server.db.client().await;
    let tables = client
        .query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", &[])
        .await
        .expect("tables");
    let mut text = String::new();
    for table in tables {
        let name: String = table.get(0);
        let sql = format!("SELECT coalesce(string_agg(t::text, ''), '') FROM \"{name}\" t");
        let rows: String = client.query_one(&sql, &[]).await.expect("rows").get(0);
        text.push_str(&rows);
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_launch_answer_is_found_by_name_before_anything_is_launched_again() {
    let (server, sim, _dir) = dispatching(&["--lose-launch-answers"]).await;
    let acme = tenant_token("acme");
    let lease = assigned(&server, &acme, "r-lost", "trusted").await;
    let launched =
        operator_reads(&server, &lease, "its instance found", |read| !read["instanceId"].is_null())
            .await;
    let instances = sim.get("/sim/instances").await;
    assert_eq!(instances.as_array().map(Vec::len), Some(1), "{instances}");
    assert_eq!(instances[0]["launches"], 1, "never launched twice: {instances}");
    assert_eq!(launched["instanceId"], instances[0]["id"]);
    let requests = sim.get("/sim/requests").await;
    assert!(requests["find"].as_u64() >= Some(1), "found by name: {requests}");
    assert_eq!(requests["mint"], 1, "one registration for one launch: {requests}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_registration_is_minted_for_a_trust_class_no_node_accepts() {
    let (server, sim, _dir) = dispatching(&["--refuse-trust", "untrusted"]).await;
    let acme = tenant_token("acme");
    let refused = assigned(&server, &acme, "r-fork", "untrusted").await;
    let accepted = assigned(&server, &acme, "r-own", "trusted").await;
    operator_reads(&server, &accepted, "launched", |read| !read["instanceId"].is_null()).await;
    // The dispatcher asked about the refused one first (its work is older) and went on.
    let requests = sim.get("/sim/requests").await;
    assert!(requests["accepts"].as_u64() >= Some(2), "{requests}");
    assert_eq!(requests["mint"], 1, "only the accepted lease's registration: {requests}");
    let operator = role_token(Role::Operator, None);
    let read = server.graphql(&operator, LEASE, json!({ "id": refused })).await;
    assert_eq!(data(&read)["runnerLease"]["phase"], "assigned", "never bound: {read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_refused_for_good_fails_the_lease_and_keeps_nothing_of_the_refusal() {
    // The simulated backend echoes the registration in its refusal, as careless ones do.
    let (server, sim, _dir) = dispatching_logging(&["--refuse-launches"], "trace").await;
    let acme = tenant_token("acme");
    let lease = assigned(&server, &acme, "r-refused", "trusted").await;
    let failed =
        operator_reads(&server, &lease, "released", |read| read["phase"] == "teardown").await;
    assert_eq!(
        (failed["outcome"].as_str(), failed["failureReason"].as_str()),
        (Some("failed"), Some("LaunchRefused")),
        "{failed}"
    );
    // No instance was made, and none is declared gone on the strength of an absence: it
    // stays charged until its reap and its node's inventory prove it.
    let capacity = server.graphql(&acme, "{ runnerCapacity { vcpu } }", json!({})).await;
    assert_eq!(data(&capacity)["runnerCapacity"]["vcpu"], 4);
    let registrations = sim.get("/sim/registrations").await;
    let registration = registrations[0].as_str().expect("one minted").to_string();
    assert!(!server.logs().contains(&registration), "a log line holds the registration");
    assert!(!every_row(&server).await.contains(&registration), "a row holds the registration");
}

/// A lease launched on a backend whose first answer is lost and whose listing misses the
/// instance `misses` times: its instance recorded, and the sim's request counts.
async fn lost_and_lagging(misses: &str) -> Value {
    let faults = ["--lose-launch-answers", "--find-misses", misses];
    let (server, sim, _dir) = dispatching(&faults).await;
    let acme = tenant_token("acme");
    let lease = assigned(&server, &acme, "r-taken", "trusted").await;
    let launched = operator_reads(&server, &lease, "its instance recorded", |read| {
        !read["instanceId"].is_null()
    })
    .await;
    assert_eq!(launched["phase"], "launching", "not failed: {launched}");
    let instances = sim.get("/sim/instances").await;
    assert_eq!(instances.as_array().map(Vec::len), Some(1), "{instances}");
    assert_eq!(launched["instanceId"], instances[0]["id"]);
    sim.get("/sim/requests").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_missed_lookup_mints_no_second_registration() {
    let requests = lost_and_lagging("1").await;
    assert_eq!(requests["mint"], 1, "looked again instead: {requests}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_answered_taken_is_the_leases_own_instance_not_a_refusal() {
    // Two misses a backoff apart: launched again, answered 409, and that instance is the
    // lease's (recorded, never a refusal).
    let requests = lost_and_lagging("2").await;
    assert_eq!(
        (requests["mint"].as_u64(), requests["launch"].as_u64()),
        (Some(2), Some(2)),
        "{requests}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_instance_is_destroyed_and_nothing_else_is() {
    let (server, sim, _dir) = dispatching(&[]).await;
    let acme = tenant_token("acme");
    let live = assigned(&server, &acme, "r-live", "trusted").await;
    operator_reads(&server, &live, "launched", |read| !read["instanceId"].is_null()).await;
    // A crash between a node's launch and anything Leasehold recorded, and a foreign one.
    let nobody = leasehold_domain::runner::RunnerLeaseId(uuid::Uuid::now_v7()).instance_name();
    let http = reqwest::Client::new();
    for name in [nobody.as_str(), "not-ours-1"] {
        let made = http.post(format!("{}/sim/orphan/{name}", sim.url)).send().await;
        assert!(made.expect("answered").status().is_success());
    }
    let instances = eventually("the orphan destroyed", || async {
        let instances = sim.get("/sim/instances").await;
        let list = instances.as_array().cloned().unwrap_or_default();
        let orphan = list.iter().find(|held| held["name"] == nobody.as_str())?;
        (orphan["terminal"] == true).then_some(list)
    })
    .await;
    let running =
        |name: &str| instances.iter().any(|held| held["name"] == name && held["running"] == true);
    assert!(running("not-ours-1"), "another name is not Leasehold's: {instances:?}");
    let live_name = format!("billet-{}", live.as_str().expect("an id").replace('-', ""));
    assert!(running(&live_name), "a live lease's instance is its lease's: {instances:?}");
}

/// An orphan whose destroy keeps failing is tried on every sweep, and after five failures in
/// a row it is a dead letter operators see (rule 35), once, naming its node and instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_that_will_not_die_becomes_a_dead_letter_after_five_tries() {
    let (server, sim, _dir) = dispatching(&["--fail-destroys"]).await;
    let nobody = leasehold_domain::runner::RunnerLeaseId(uuid::Uuid::now_v7()).instance_name();
    let made = sim.http.post(format!("{}/sim/orphan/{nobody}", sim.url)).send().await;
    assert!(made.expect("answered").status().is_success());
    let operator = role_token(Role::Operator, None);
    let query = "{ deadLetters { kind entityId retryCount payload } }";
    let letter = eventually("the orphan dead-lettered", || async {
        let letters = server.graphql(&operator, query, json!({})).await;
        let letters = data(&letters)["deadLetters"].as_array().cloned().unwrap_or_default();
        letters.into_iter().find(|letter| letter["kind"] == "orphan_destroy")
    })
    .await;
    let entity = letter["entityId"].as_str().expect("an entity");
    assert!(
        entity.starts_with("runner-node-") && entity.ends_with(&format!("/{nobody}")),
        "{letter}"
    );
    assert_eq!(letter["payload"]["attempts"], 5, "{letter}");
    assert_eq!(letter["retryCount"], 1);
    let instances = sim.get("/sim/instances").await;
    let tried =
        instances.as_array().into_iter().flatten().find(|held| held["name"] == nobody.as_str());
    let tried = tried.expect("the orphan is still there");
    assert!(tried["destroys"].as_u64().unwrap_or_default() >= 5, "{tried}");
    assert_eq!(tried["running"], true, "{tried}");
    // Tenants never see dead letters.
    let refused = server.graphql(&tenant_token("acme"), query, json!({})).await;
    assert_eq!(code(&refused), Some("FORBIDDEN"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_waits_for_room_on_a_node_and_is_launched_once_there_is() {
    let (server, sim, _dir) = dispatching(&[]).await;
    // The node registers again with room for one 4-vCPU runner only.
    let small = json!({ "input": {
        "operationKey": "reg-small", "provider": "docker", "guestOs": ["linux"],
        "accepts": ["trusted"], "vcpu": 6, "memoryMb": 65536, "inventory": [] } });
    data(&server.graphql(&node_agent(), REGISTER, small).await);
    let acme = tenant_token("acme");
    let first = assigned(&server, &acme, "r-first", "trusted").await;
    operator_reads(&server, &first, "launched", |read| !read["instanceId"].is_null()).await;
    let second = assigned(&server, &acme, "r-second", "trusted").await;
    // The dispatcher tried it and found no node with room: its work waits (the outbox says
    // why), and it is bound to no node meanwhile.
    let stream = format!("runner-lease-{}", second.as_str().expect("an id"));
    let client = server.db.client().await;
    eventually("the second lease's launch waiting for room", || async {
        let row = client
            .query_opt(
                "SELECT last_error FROM dispatch_outbox WHERE stream_id = $1 AND state = 'pending'",
                &[&stream],
            )
            .await
            .expect("readable");
        let why: Option<String> = row.and_then(|row| row.get(0));
        why.filter(|why| why.contains("no runner node can take")).map(|_| ())
    })
    .await;
    let assigned_read = |read: &Value| read["phase"] == "assigned";
    let waiting = operator_reads(&server, &second, "read assigned", assigned_read).await;
    assert_eq!(waiting["node"], Value::Null, "not bound to a full node: {waiting}");
    let release =
        json!({ "input": { "leaseId": first, "operationKey": "x-first", "outcome": "done" } });
    data(&server.graphql(&acme, RELEASE, release).await);
    operator_reads(&server, &second, "launched once there is room", |read| {
        !read["instanceId"].is_null()
    })
    .await;
    let instances = sim.get("/sim/instances").await;
    assert_eq!(instances.as_array().map(Vec::len), Some(2), "{instances}");
}
