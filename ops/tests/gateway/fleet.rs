//! The fleet through a real `leasehold serve`: an operator registers hosts, a tenant creates
//! and reads its VMs, the host's agent reports on them with a token bound to its host, and no
//! tenant reaches another's VM by id, in `vms`, in `workloads` or on the event feed.

use chrono::TimeDelta;
use leasehold_domain::values::fleet::HostId;
use leasehold_gateway::Role;
use serde_json::{Value, json};

use crate::backend::eventually;
use crate::support::*;

pub(crate) const REGISTER: &str =
    "mutation($input: RegisterHostInput!) { registerHost(input: $input) { id version } }";
pub(crate) const CREATE: &str = "mutation($input: CreateVmInput!) { createVm(input: $input) { id version cursor events { type } } }";
pub(crate) const VM: &str = "query($id: ID!) { vm(id: $id) { id taskId state taskState hostId url spec reason message destroyReason } }";
const REPORT: &str =
    "mutation($input: VmReportInput!) { reportVmBoot(input: $input) { id version } }";

pub(crate) fn host_agent(host: &str) -> String {
    secret().mint_host_agent(
        "agent-1",
        &HostId::parse("host", host).expect("valid"),
        TimeDelta::hours(1),
    )
}

pub(crate) async fn register(server: &Server, host: &str, vm_count: i64) -> Value {
    register_at(server, host, vm_count, ("http://127.0.0.1:9", None)).await
}

pub(crate) async fn register_at(
    server: &Server,
    host: &str,
    vm_count: i64,
    (url, token): (&str, Option<&str>),
) -> Value {
    let operator = role_token(Role::Operator, None);
    let input = json!({ "input": {
        "operationKey": format!("reg-{host}"), "hostId": host, "url": url, "token": token,
        "cpus": 16, "ramMb": 65536, "storageGb": 1000, "vmCount": vm_count,
        "labels": [{ "key": "zone", "value": "a" }],
    }});
    let answer = server.graphql(&operator, REGISTER, input).await;
    data(&answer)["registerHost"].clone()
}

pub(crate) fn create_input(key: &str, task: &str) -> Value {
    json!({ "input": { "operationKey": key, "taskId": task, "cpus": 2, "ramMb": 2048, "storageGb": 10 } })
}

/// Waits (bounded) until the host projection has the host: placement reads its catalog.
pub(crate) async fn wait_for_host(server: &Server, host: &str) {
    let operator = role_token(Role::Operator, None);
    eventually(&format!("host {host} being projected"), || async {
        let answer = server.graphql(&operator, "{ hosts { id state vmCount } }", json!({})).await;
        let hosts = data(&answer)["hosts"].as_array().cloned().unwrap_or_default();
        hosts.iter().any(|h| h["id"] == host).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_creates_reads_and_destroys_its_vm_and_the_agent_reports_on_it() {
    let server = Server::start().await;
    register(&server, "agent-1", 4).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let mut input = create_input("c-1", "build-1");
    input["input"]["secrets"] = json!([{ "name": "API_KEY", "value": "s3cr3t-gql-91d2" }]);
    let answer = server.graphql(&acme, CREATE, input).await;
    assert!(!answer.to_string().contains("s3cr3t-gql-91d2"), "{answer}");
    let created = data(&answer)["createVm"].clone();
    assert_eq!(
        created["events"],
        json!([{ "type": "VmProvisioning" }, { "type": "TaskAssigned" }, { "type": "VmScheduled" }])
    );
    let read = server
        .graphql_with(&acme, json!({ "query": VM, "variables": { "id": created["id"] }, "extensions": { "minCursor": created["cursor"] } }))
        .await;
    let vm = &data(&read)["vm"];
    assert_eq!(
        (vm["state"].as_str(), vm["hostId"].as_str(), vm["taskState"].as_str()),
        (Some("provisioning"), Some("agent-1"), Some("assigned")),
        "{read}"
    );
    assert_eq!(vm["spec"]["cpus"], 2);
    assert!(!read.to_string().contains("s3cr3t-gql-91d2"), "{read}");

    // The agent of another host does not find it; its own host's agent reports the boot,
    // and a report naming another operation is fenced.
    let operation = current_boot(&server, &created["id"]).await;
    let server = &server;
    let report = |token: String, op: String, key: &str| {
        let input = json!({ "input": { "vmId": created["id"], "operationKey": key, "operationId": op, "url": "127.0.0.1:19551" } });
        async move { server.graphql(&token, REPORT, input).await }
    };
    let elsewhere = report(host_agent("agent-2"), operation.clone(), "b-0").await;
    assert_eq!(code(&elsewhere), Some("NOT_FOUND"), "{elsewhere}");
    let stale = report(host_agent("agent-1"), uuid::Uuid::nil().to_string(), "b-1").await;
    assert_eq!(code(&stale), Some("FENCED"), "{stale}");
    let booted = report(host_agent("agent-1"), operation, "b-2").await;
    assert_eq!(data(&booted)["reportVmBoot"]["version"], 5, "{booted}");
    // A tenant token is not an agent's.
    let forged = server.graphql(&acme, REPORT, json!({ "input": { "vmId": created["id"], "operationKey": "b-3", "operationId": uuid::Uuid::nil().to_string(), "url": "x:1" } })).await;
    assert_eq!(code(&forged), Some("FORBIDDEN"), "{forged}");

    // Its agent reports it used; a tenant cannot.
    let activity = "mutation($input: VmOperationInput!) { reportVmActivity(input: $input) { events { type } } }";
    let used = json!({ "input": { "vmId": created["id"], "operationKey": "u-1" } });
    let reported = server.graphql(&host_agent("agent-1"), activity, used.clone()).await;
    assert_eq!(data(&reported)["reportVmActivity"]["events"], json!([{ "type": "VmActive" }]));
    assert_eq!(code(&server.graphql(&acme, activity, used).await), Some("FORBIDDEN"));

    let destroyed = server
        .graphql(
            &acme,
            "mutation($input: VmOperationInput!) { destroyVm(input: $input) { events { type } } }",
            json!({ "input": { "vmId": created["id"], "operationKey": "d-1" } }),
        )
        .await;
    assert_eq!(
        data(&destroyed)["destroyVm"]["events"],
        json!([{ "type": "VmDestroying" }, { "type": "TaskFailed" }])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_vm_is_not_found_anywhere() {
    let server = Server::start().await;
    register(&server, "agent-1", 4).await;
    wait_for_host(&server, "agent-1").await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let created = data(&created)["createVm"].clone();
    // Wait until acme reads its own VM, so that what globex sees is the projection's answer.
    let own = server
        .graphql_with(&acme, json!({ "query": VM, "variables": { "id": created["id"] }, "extensions": { "minCursor": created["cursor"] } }))
        .await;
    assert_eq!(data(&own)["vm"]["id"], created["id"]);
    let theirs = server.graphql(&globex, VM, json!({ "id": created["id"] })).await;
    assert_eq!(code(&theirs), Some("NOT_FOUND"), "{theirs}");
    let list = server
        .graphql(
            &globex,
            "{ vms { edges { node { id } } } workloads { edges { node { id kind } } } }",
            json!({}),
        )
        .await;
    assert_eq!(data(&list)["vms"]["edges"], json!([]), "{list}");
    assert_eq!(data(&list)["workloads"]["edges"], json!([]), "{list}");
    let destroy = server
        .graphql(
            &globex,
            "mutation($input: VmOperationInput!) { destroyVm(input: $input) { id } }",
            json!({ "input": { "vmId": created["id"], "operationKey": "d-1" } }),
        )
        .await;
    assert_eq!(code(&destroy), Some("NOT_FOUND"), "{destroy}");
    let events = server
        .graphql(&globex, "{ events(first: 50) { edges { node { streamType type } } } }", json!({}))
        .await;
    assert_eq!(data(&events)["events"]["edges"], json!([]), "{events}");
    // acme's own feed shows its VM's events, through the tenant views: no credentials'
    // reference, no operation; and no host event (the fleet's) at all.
    let feed = server
        .graphql(&acme, "{ events(first: 50, filter: { streamTypes: [\"vm\", \"host\"] }) { edges { node { streamType type payload } } } }", json!({}))
        .await;
    let edges = data(&feed)["events"]["edges"].as_array().expect("a list").clone();
    let types: Vec<&str> = edges.iter().filter_map(|e| e["node"]["type"].as_str()).collect();
    assert_eq!(types, ["VmProvisioning", "TaskAssigned", "VmScheduled"], "{feed}");
    assert!(edges.iter().all(|e| e["node"]["streamType"] == "vm"));
    assert!(edges[0]["node"]["payload"].get("credentials").is_none(), "{feed}");
    assert!(edges[2]["node"]["payload"].get("operation").is_none(), "{feed}");
    assert_eq!(
        edges[2]["node"]["payload"]["placement"],
        json!({ "host": "agent-1", "policy": "spread" })
    );
    // acme's own workloads list its VM.
    let mine = server
        .graphql(&acme, "{ workloads { edges { node { id kind status } } } }", json!({}))
        .await;
    assert_eq!(data(&mine)["workloads"]["edges"][0]["node"]["kind"], "vm", "{mine}");
    // A token naming the fleet's reserved tenant is refused outright.
    let fleet = tenant_token("leasehold:fleet");
    let refused = server.graphql(&fleet, "{ vms { edges { node { id } } } }", json!({})).await;
    assert_eq!(code(&refused), Some("UNAUTHENTICATED"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_refusals_name_their_gate() {
    let server = Server::start().await;
    register(&server, "agent-1", 1).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let first = server.graphql(&acme, CREATE, create_input("c-1", "t-1")).await;
    assert!(data(&first)["createVm"]["id"].is_string(), "{first}");
    let full = server.graphql(&acme, CREATE, create_input("c-2", "t-2")).await;
    assert_eq!(code(&full), Some("INVALID_STATE"), "{full}");
    assert!(full.to_string().contains("vm_count"), "{full}");
    let mut labelled = create_input("c-3", "t-3");
    labelled["input"]["labels"] = json!([{ "key": "zone", "value": "b" }]);
    let gated = server.graphql(&acme, CREATE, labelled).await;
    assert!(gated.to_string().contains("labels"), "{gated}");
    let mut bad = create_input("c-4", "t-4");
    bad["input"]["guestFiles"] = json!(["/fuse/secrets.json"]);
    let refused = server.graphql(&acme, CREATE, bad).await;
    assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    assert!(refused.to_string().contains("guestFiles[0]"), "{refused}");
}

/// The VM's current operation, as its stream holds it.
async fn current_boot(server: &Server, id: &Value) -> String {
    let client = server.db.client().await;
    let row = client
        .query_one(
            "SELECT payload->>'operation' FROM events WHERE stream_id = 'vm-' || $1 AND event_type = 'VmScheduled'",
            &[&id.as_str().expect("an id")],
        )
        .await
        .expect("scheduled");
    row.get(0)
}

pub(crate) const AGENT_TOKEN: &str = "fc-agent-token-for-the-fleet-tests";

/// `leasehold backend-sim --host-agent`, running until dropped.
pub(crate) struct Agent {
    pub(crate) url: String,
    token: String,
    _child: tokio::process::Child,
    _dir: TempDir,
}

impl Agent {
    /// How many requests the agent received on `route` (the simulator's count).
    pub(crate) async fn count(&self, route: &str) -> u64 {
        let counts: Value = reqwest::Client::new()
            .get(format!("{}/sim/requests", self.url))
            .send()
            .await
            .expect("the agent answers")
            .json()
            .await
            .expect("JSON");
        counts[route].as_u64().unwrap_or(0)
    }
}

pub(crate) async fn start_agent(extra: &[&str]) -> Agent {
    start_agent_with(AGENT_TOKEN, extra).await
}

/// An agent wanting `token`.
pub(crate) async fn start_agent_with(token: &str, extra: &[&str]) -> Agent {
    let dir = TempDir(std::env::temp_dir().join(format!("lh-agent-{}", uuid::Uuid::now_v7())));
    std::fs::create_dir_all(&dir.0).expect("a directory");
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, token).expect("written");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command.args(["backend-sim", "--host-agent", "--token-file"]).arg(&token_file).args(extra);
    let (url, child) = leasehold_tests::spawn_listening(command).await;
    Agent { url, token: token.to_owned(), _child: child, _dir: dir }
}

/// Waits (bounded) until the tenant's VM is in `state`; its last answer.
pub(crate) async fn wait_for_state(server: &Server, token: &str, id: &Value, state: &str) -> Value {
    eventually(&format!("VM {id} becoming {state}"), || async {
        let answer = server.graphql(token, VM, json!({ "id": id })).await;
        (answer["data"]["vm"]["state"] == state).then_some(answer)
    })
    .await
}

pub(crate) async fn agent_vms(agent: &Agent) -> Value {
    reqwest::Client::new()
        .get(format!("{}/v1/vm?prefix=lh-", agent.url))
        .bearer_auth(&agent.token)
        .send()
        .await
        .expect("the agent answers")
        .json()
        .await
        .expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_boots_and_destroys_vms_on_their_hosts_agent() {
    let agent = start_agent(&[]).await;
    let server = Server::start().await;
    register_at(&server, "agent-1", 4, (&agent.url, Some(AGENT_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let id = data(&created)["createVm"]["id"].clone();
    let running = wait_for_state(&server, &acme, &id, "running").await;
    assert_eq!(running["data"]["vm"]["taskState"], "running");
    assert!(running["data"]["vm"]["url"].as_str().is_some_and(|url| url.starts_with("127.0.0.1:")));
    let name = format!("lh-{}", id.as_str().expect("an id"));
    assert_eq!(agent_vms(&agent).await["vms"][0]["vm_id"], name.as_str());

    let destroy = "mutation($input: VmOperationInput!) { destroyVm(input: $input) { id } }";
    let input = json!({ "input": { "vmId": id, "operationKey": "d-1" } });
    data(&server.graphql(&acme, destroy, input).await);
    wait_for_state(&server, &acme, &id, "destroyed").await;
    assert_eq!(agent_vms(&agent).await["vms"], json!([]), "the agent no longer has it");
    // Its room is given back once the agent confirmed it gone.
    let operator = role_token(Role::Operator, None);
    eventually("the host's room being released", || async {
        let hosts = server.graphql(&operator, "{ hosts { id vmCount } }", json!({})).await;
        (data(&hosts)["hosts"][0]["vmCount"] == 0).then_some(())
    })
    .await;
    // The host's token is nowhere in the log or the read models.
    let client = server.db.client().await;
    let leaks: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM events WHERE payload::text LIKE '%' || $1 || '%') \
             + (SELECT count(*) FROM hosts h WHERE row_to_json(h)::text LIKE '%' || $1 || '%')",
            &[&AGENT_TOKEN],
        )
        .await
        .expect("readable")
        .get(0);
    assert_eq!(leaks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_the_agent_fails_fails_the_vm_and_gives_its_room_back() {
    let agent = start_agent(&["--fail-boots"]).await;
    let server = Server::start().await;
    register_at(&server, "agent-1", 4, (&agent.url, Some(AGENT_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let id = data(&created)["createVm"]["id"].clone();
    let failed = wait_for_state(&server, &acme, &id, "failed").await;
    assert_eq!(failed["data"]["vm"]["reason"], "BootFailed");
    assert_eq!(failed["data"]["vm"]["message"], "the host could not boot the VM");
    assert!(!failed.to_string().contains("firecracker"), "operator detail stays with operators");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_vm_is_torn_down_on_the_second_sweep_and_operators_see_its_dead_letter() {
    let agent = start_agent(&[]).await;
    let server = Server::start_with(&["--vm-stuck-after", "1s", "--vm-sweep-every", "1s"]).await;
    register_at(&server, "agent-1", 4, (&agent.url, Some(AGENT_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let id = data(&created)["createVm"]["id"].clone();
    let destroyed = wait_for_state(&server, &acme, &id, "destroyed").await;
    assert_eq!(destroyed["data"]["vm"]["taskState"], "failed");
    let letters =
        dead_letters(&server, "{ deadLetters { kind entityId taskId retryCount } }").await;
    assert_eq!(
        data(&letters)["deadLetters"][0],
        json!({ "kind": "stuck_task", "entityId": id, "taskId": "build-1", "retryCount": 1 })
    );
    let refused = server.graphql(&acme, "{ deadLetters { kind } }", json!({})).await;
    assert_eq!(code(&refused), Some("FORBIDDEN"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_agents_token_reaches_no_lease() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let host = host_agent("agent-1");
    let work = server
        .graphql(
            &host,
            "query($id: ID!) { leaseWork(id: $id) { operationId } }",
            json!({ "id": lease["id"] }),
        )
        .await;
    assert_eq!(code(&work), Some("FORBIDDEN"), "{work}");
    let input = report_input(&server, &lease["id"], "up-1").await;
    let reported = server.graphql(&host, REPORT_PROVISIONED, input).await;
    assert_eq!(code(&reported), Some("FORBIDDEN"), "{reported}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_destroys_a_vm_its_agent_lost_and_deletes_an_orphan() {
    let agent = start_agent(&[]).await;
    let server = Server::start_with(&["--vm-inventory-every", "1s"]).await;
    register_at(&server, "agent-1", 4, (&agent.url, Some(AGENT_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let id = data(&created)["createVm"]["id"].clone();
    wait_for_state(&server, &acme, &id, "running").await;
    // The host loses the VM (as a crash would): the log learns it and lets it go.
    let http = reqwest::Client::new();
    let name = format!("lh-{}", id.as_str().expect("an id"));
    let vanished =
        http.post(format!("{}/sim/vanish/{name}", agent.url)).send().await.expect("sent");
    assert_eq!(vanished.status(), 204);
    let gone = wait_for_state(&server, &acme, &id, "destroyed").await;
    assert_eq!(gone["data"]["vm"]["destroyReason"], "missing", "{gone}");
    // A VM the agent has and the log does not is an orphan: deleted.
    let orphan = format!("lh-{}", uuid::Uuid::now_v7());
    make_orphan(&agent, &orphan).await;
    eventually("the orphan being deleted", || async {
        (agent_vms(&agent).await["vms"] == json!([])).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_that_will_not_die_becomes_a_dead_letter_after_five_tries() {
    let agent = start_agent(&["--fail-deletes"]).await;
    let server = Server::start_with(&["--vm-inventory-every", "1s"]).await;
    let orphan = format!("lh-{}", uuid::Uuid::now_v7());
    make_orphan(&agent, &orphan).await;
    register_at(&server, "agent-1", 4, (&agent.url, Some(AGENT_TOKEN))).await;
    let letters = dead_letters(&server, "{ deadLetters { kind entityId retryCount } }").await;
    let letter = &data(&letters)["deadLetters"][0];
    assert_eq!(letter["kind"], "orphan_destroy");
    assert_eq!(letter["entityId"], format!("host-agent-1/{orphan}"));
    assert_eq!(letter["retryCount"], 1, "one dead letter, however long it keeps failing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_agent_reports_its_recovery_lookups() {
    let server = Server::start().await;
    register(&server, "agent-1", 4).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let id = data(&created)["createVm"]["id"].clone();
    let operation = current_boot(&server, &id).await;
    let lookup =
        "mutation($input: VmReportInput!) { reportVmLookup(input: $input) { events { type } } }";
    let input = |key: &str, url: Option<&str>| json!({ "input": { "vmId": id, "operationKey": key, "operationId": operation, "url": url } });
    let agent = host_agent("agent-1");
    // Found: the provisioning VM is running.
    let found = server.graphql(&agent, lookup, input("l-1", Some("127.0.0.1:19551"))).await;
    assert_eq!(
        data(&found)["reportVmLookup"]["events"],
        json!([{ "type": "VmRecovered" }, { "type": "VmRunning" }, { "type": "TaskRunning" }])
    );
    // Then gone: destroyed as missing.
    let missing = server.graphql(&agent, lookup, input("l-2", None)).await;
    assert_eq!(
        data(&missing)["reportVmLookup"]["events"],
        json!([{ "type": "VmRecovered" }, { "type": "VmDestroying" }, { "type": "TaskFailed" }])
    );
    let bad = json!({ "input": { "vmId": id, "operationKey": "l-3", "operationId": operation, "reason": "Gone" } });
    assert_eq!(code(&server.graphql(&agent, lookup, bad).await), Some("BAD_USER_INPUT"));
}

/// A VM made at the agent behind the log's back: an orphan.
async fn make_orphan(agent: &Agent, name: &str) {
    let made = reqwest::Client::new()
        .post(format!("{}/v1/vm", agent.url))
        .bearer_auth(AGENT_TOKEN)
        .json(&json!({ "name": name, "cpus": 1, "memory_mb": 512, "storage_gb": 1, "region": "" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(made.status(), 200);
}

/// Waits until operators see a dead letter; the answer to `query`.
async fn dead_letters(server: &Server, query: &str) -> Value {
    let operator = role_token(Role::Operator, None);
    eventually("a dead letter", || async {
        let answer = server.graphql(&operator, query, json!({})).await;
        let letters = data(&answer)["deadLetters"].as_array().is_some_and(|l| !l.is_empty());
        letters.then_some(answer)
    })
    .await
}
