//! CI-runner leases through a real `leasehold serve`, by role: a tenant requests, assigns and
//! releases runner leases against the runner capacity an operator set; an operator reads
//! every tenant's, sees runner usage and is refused a force outside custody, teardown and
//! quarantine; a runner node's agent registers its node and reports its inventory, fenced by
//! its registration, and reaches no lease that is not bound to it; no tenant reaches
//! another's lease; and the server's reaper fails a lease whose holder went quiet.

use chrono::TimeDelta;
use leasehold_domain::runner::RunnerNodeName;
use leasehold_gateway::Role;
use serde_json::{Value, json};

use crate::backend::eventually;
use crate::rented::read_at;
use crate::support::*;

pub(crate) const REQUEST: &str = "mutation($input: RequestRunnerLeaseInput!) { requestRunnerLease(input: $input) { id version cursor duplicate events { type } } }";
pub(crate) const ASSIGN: &str = "mutation($input: AssignRunnerJobInput!) { assignRunnerJob(input: $input) { id version cursor events { type } } }";
const RELEASE: &str = "mutation($input: ReleaseRunnerLeaseInput!) { releaseRunnerLease(input: $input) { id version cursor events { type } } }";
const LIMITS: &str = "mutation($input: SetRunnerLimitsInput!) { setRunnerLimits(input: $input) { id cursor events { type } } }";
const FORCE: &str =
    "mutation($input: ForceRunnerReleaseInput!) { forceRunnerRelease(input: $input) { id } }";
const LEASE: &str = "query($id: ID!) { runnerLease(id: $id) { id tenantId tier trust guestOs vcpu memoryMb providers phase jobRequestId jobRunId outcome failureReason teardown node epoch instanceId } }";
const CAPACITY: &str = "{ runnerCapacity { vcpu maxVcpu memoryMb maxMemoryMb macos maxMacosSlots tiers { tier leases max } } }";
const REGISTER: &str = "mutation($input: RegisterRunnerNodeInput!) { registerRunnerNode(input: $input) { id version events { type } } }";
const INVENTORY: &str = "mutation($input: RunnerInventoryInput!) { reportRunnerInventory(input: $input) { id version events { type } } }";
const HEARTBEAT: &str =
    "mutation($input: RunnerReportInput!) { reportRunnerHeartbeat(input: $input) { id } }";

/// `requestRunnerLease`'s input: a Linux runner of 4 vCPUs and 8 GiB on tier `linux-4x`.
pub(crate) fn request_input(key: &str, ttl_seconds: u32) -> Value {
    json!({ "input": {
        "operationKey": key, "tier": "linux-4x", "trust": "trusted", "guestOs": "linux",
        "resources": { "vcpu": 4, "memoryMb": 8192 }, "providers": ["docker"],
        "command": ["./run.sh", "--once"], "ttlSeconds": ttl_seconds,
    }})
}

/// `token`'s new runner lease (`key`), its id.
pub(crate) async fn request(server: &Server, token: &str, key: &str) -> Value {
    let requested = server.graphql(token, REQUEST, request_input(key, 600)).await;
    data(&requested)["requestRunnerLease"]["id"].clone()
}

fn assign_input(lease: &Value, job: u128, key: &str) -> Value {
    json!({ "input": {
        "leaseId": lease, "operationKey": key,
        "requestId": uuid::Uuid::from_u128(job).to_string(), "runId": 7,
    }})
}

fn release_input(lease: &Value, outcome: &str, key: &str) -> Value {
    json!({ "input": { "leaseId": lease, "operationKey": key, "outcome": outcome } })
}

fn types(answer: &Value, field: &str) -> Vec<String> {
    let events = data(answer)[field]["events"].as_array().cloned().unwrap_or_default();
    events.iter().map(|event| event["type"].as_str().unwrap_or_default().to_string()).collect()
}

fn node_agent(name: &str) -> String {
    let node = RunnerNodeName::parse("node", name).expect("valid");
    secret().mint_runner_node_agent(&format!("runner-{name}"), &node, TimeDelta::hours(1))
}

/// The operator gives `tenant` room for two `linux-4x` runners (8 vCPUs).
async fn room_for_two(server: &Server, tenant: &str) {
    let limits = json!({ "input": {
        "tenantId": tenant, "operationKey": format!("limits-{tenant}"), "vcpu": 8,
        "memoryMb": 65536, "tiers": [{ "tier": "linux-4x", "max": 2 }], "macosSlots": 0,
    }});
    let operator = role_token(Role::Operator, None);
    let set = server.graphql(&operator, LIMITS, limits).await;
    assert_eq!(types(&set, "setRunnerLimits"), ["RunnerLimitsSet"], "{set}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_leases_runners_within_the_capacity_an_operator_set() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    room_for_two(&server, "acme").await;
    let requested = server.graphql(&acme, REQUEST, request_input("r-1", 600)).await;
    assert_eq!(types(&requested, "requestRunnerLease"), ["RunnerLeaseRequested"], "{requested}");
    let again = server.graphql(&acme, REQUEST, request_input("r-1", 600)).await;
    assert_eq!(data(&again)["requestRunnerLease"]["duplicate"], true, "a retry is the first");
    let first = data(&requested)["requestRunnerLease"]["id"].clone();
    let assigned = server.graphql(&acme, ASSIGN, assign_input(&first, 1, "a-1")).await;
    // The lease's own event (its capacity and its job are charged in the same append, on
    // their own streams: the capacity below shows it).
    assert_eq!(types(&assigned, "assignRunnerJob"), ["RunnerJobAssigned"], "{assigned}");
    let (second, third) =
        (request(&server, &acme, "r-2").await, request(&server, &acme, "r-3").await);
    data(&server.graphql(&acme, ASSIGN, assign_input(&second, 2, "a-2")).await);
    let full = server.graphql(&acme, ASSIGN, assign_input(&third, 3, "a-3")).await;
    assert_eq!(code(&full), Some("QUOTA_EXCEEDED"), "{full}");
    let capacity = server.graphql(&acme, CAPACITY, json!({})).await;
    assert_eq!(
        data(&capacity)["runnerCapacity"],
        json!({ "vcpu": 8, "maxVcpu": 8, "memoryMb": 16384, "maxMemoryMb": 65536, "macos": 0,
                "maxMacosSlots": 0, "tiers": [{ "tier": "linux-4x", "leases": 2, "max": 2 }] })
    );
    // Another lease with a job the second holds: no room is checked first, nothing charged.
    let taken = server.graphql(&acme, ASSIGN, assign_input(&third, 2, "a-3b")).await;
    assert_eq!(code(&taken), Some("QUOTA_EXCEEDED"), "no room is checked first: {taken}");
    let released = server.graphql(&acme, RELEASE, release_input(&first, "done", "x-1")).await;
    assert_eq!(types(&released, "releaseRunnerLease"), ["RunnerReleased"], "{released}");
    let twice = server.graphql(&acme, RELEASE, release_input(&first, "done", "x-1b")).await;
    assert_eq!(types(&twice, "releaseRunnerLease"), Vec::<String>::new(), "once recorded");
    let contradicts = server.graphql(&acme, RELEASE, release_input(&first, "failed", "x-1c")).await;
    assert_eq!(code(&contradicts), Some("CONFLICT"), "{contradicts}");
    let taken = server.graphql(&acme, ASSIGN, assign_input(&third, 2, "a-3c")).await;
    assert_eq!(code(&taken), Some("CONFLICT"), "the second lease holds that job: {taken}");
    let cursor = data(&server.graphql(&acme, ASSIGN, assign_input(&third, 3, "a-3d")).await)
        ["assignRunnerJob"]["cursor"]
        .clone();
    // The tenant reads its lease without its epoch, node or instance; an operator with them.
    let read = read_at(&server, &acme, (LEASE, json!({ "id": first })), &cursor).await;
    let read = data(&read)["runnerLease"].clone();
    assert_eq!((read["phase"].as_str(), read["outcome"].as_str()), (Some("done"), Some("done")));
    assert_eq!(
        (&read["tenantId"], &read["epoch"], &read["node"]),
        (&Value::Null, &Value::Null, &Value::Null),
        "{read}"
    );
    assert!(!read.to_string().contains("run.sh"), "the start command stays hidden: {read}");
    let operator = role_token(Role::Operator, None);
    // (A cursor is sealed to its caller: the operator waits for the projection instead.)
    let seen = eventually("the operator reads the third lease assigned", || async {
        let seen = server.graphql(&operator, LEASE, json!({ "id": third })).await;
        (seen["data"]["runnerLease"]["phase"] == "assigned").then_some(())
    });
    seen.await;
    let seen = server.graphql(&operator, LEASE, json!({ "id": first })).await;
    let seen = data(&seen)["runnerLease"].clone();
    assert_eq!((seen["tenantId"].as_str(), seen["epoch"].as_i64()), (Some("acme"), Some(1)));
    let refused = server
        .graphql(
            &operator,
            FORCE,
            json!({ "input": {
            "leaseId": second, "operationKey": "f-1", "detail": "gone" } }),
        )
        .await;
    assert_eq!(code(&refused), Some("INVALID_STATE"), "only custody, teardown, quarantine");
    let usage = server
        .graphql(&operator, "{ runnerUsage { tier node leases vcpu memoryMb } }", json!({}))
        .await;
    assert_eq!(
        data(&usage)["runnerUsage"],
        json!([{ "tier": "linux-4x", "node": null, "leases": 2, "vcpu": 8, "memoryMb": 16384 }])
    );
    let page = read_at(
        &server,
        &acme,
        ("{ runnerLeases(filter: { phase: \"assigned\" }) { edges { node { id } } } runnerJobs { edges { node { requestId status outcome } } } }", json!({})),
        &cursor,
    )
    .await;
    // The one quota view shows the runner kind against the limits the operator set.
    let quota = server
        .graphql(
            &acme,
            "{ quotaUsage { kind skus { sku quantity } limits { resource used max } } }",
            json!({}),
        )
        .await;
    let runner = data(&quota)["quotaUsage"]
        .as_array()
        .and_then(|kinds| kinds.iter().find(|kind| kind["kind"] == "runner").cloned())
        .expect("the runner kind");
    assert_eq!(
        runner["limits"],
        json!([
            { "resource": "runner.vcpu", "used": 8, "max": 8 },
            { "resource": "runner.memory_mb", "used": 16384, "max": 65536 },
            { "resource": "runner.macos", "used": 0, "max": 0 },
            { "resource": "runner.tier.linux-4x", "used": 2, "max": 2 },
        ]),
        "{quota}"
    );
    let leases = &data(&page)["runnerLeases"]["edges"];
    assert_eq!(leases.as_array().map(Vec::len), Some(2), "{page}");
    let jobs = &data(&page)["runnerJobs"]["edges"];
    assert_eq!(jobs.as_array().map(Vec::len), Some(3), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_roles_reach_only_their_own() {
    let server = Server::start().await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let lease = request(&server, &acme, "r-1").await;
    // Another tenant: not found, by id and in commands; its lists hold nothing of acme's.
    let theirs = server.graphql(&globex, LEASE, json!({ "id": lease })).await;
    assert_eq!(code(&theirs), Some("NOT_FOUND"), "{theirs}");
    let assign = server.graphql(&globex, ASSIGN, assign_input(&lease, 1, "g-1")).await;
    assert_eq!(code(&assign), Some("NOT_FOUND"), "{assign}");
    let release = server.graphql(&globex, RELEASE, release_input(&lease, "done", "g-2")).await;
    assert_eq!(code(&release), Some("NOT_FOUND"), "{release}");
    let list =
        server.graphql(&globex, "{ runnerLeases { edges { node { id } } } }", json!({})).await;
    assert_eq!(data(&list)["runnerLeases"]["edges"], json!([]));
    // Bad input is named; nothing else is read into a request.
    for (field, bad) in
        [("trust", json!("unknown")), ("command", json!([])), ("providers[0]", json!(["podman"]))]
    {
        let mut input = request_input("r-bad", 600);
        input["input"][if field.starts_with("providers") { "providers" } else { field }] = bad;
        let refused = server.graphql(&acme, REQUEST, input).await;
        assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
        let message = refused["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{field}: {message}");
    }
    // A runner node's agent: registers its own node and reports its inventory under its
    // registration; reaches no lease that is not bound to its node; runs no tenant command.
    let agent = node_agent("docker-1");
    let register = json!({ "input": {
        "operationKey": "reg-1", "provider": "docker", "guestOs": ["linux"],
        "accepts": ["trusted", "untrusted"], "vcpu": 64, "memoryMb": 262144, "inventory": [] } });
    let registered = server.graphql(&agent, REGISTER, register).await;
    assert_eq!(types(&registered, "registerRunnerNode"), ["RunnerNodeRegistered"], "{registered}");
    let inventory = |epoch: u64, key: &str| json!({ "input": { "operationKey": key, "nodeEpoch": epoch, "leases": [] } });
    let reported = server.graphql(&agent, INVENTORY, inventory(1, "inv-1")).await;
    assert_eq!(types(&reported, "reportRunnerInventory"), ["RunnerInventoryReported"]);
    let stale = server.graphql(&agent, INVENTORY, inventory(0, "inv-0")).await;
    assert_eq!(code(&stale), Some("FENCED"), "{stale}");
    let beat = json!({ "input": { "leaseId": lease, "epoch": 1, "operationKey": "hb-1" } });
    let unbound = server.graphql(&agent, HEARTBEAT, beat.clone()).await;
    assert_eq!(code(&unbound), Some("NOT_FOUND"), "not bound to its node: {unbound}");
    let as_tenant = server.graphql(&agent, REQUEST, request_input("r-agent", 600)).await;
    assert_eq!(code(&as_tenant), Some("FORBIDDEN"), "{as_tenant}");
    let on_leases = server.graphql(&agent, "{ leases { edges { node { id } } } }", json!({})).await;
    assert_eq!(code(&on_leases), Some("FORBIDDEN"), "{on_leases}");
    // Other agents and tenants report nothing on runner leases, nor force or set limits.
    let lease_agent = role_token(Role::Agent, None);
    let foreign = server.graphql(&lease_agent, HEARTBEAT, beat).await;
    assert_eq!(code(&foreign), Some("FORBIDDEN"), "{foreign}");
    let force = json!({ "input": { "leaseId": lease, "operationKey": "f", "detail": "x" } });
    assert_eq!(code(&server.graphql(&acme, FORCE, force).await), Some("FORBIDDEN"));
    let usage = server.graphql(&acme, "{ runnerUsage { tier } }", json!({})).await;
    assert_eq!(code(&usage), Some("FORBIDDEN"), "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reaps_a_runner_lease_whose_holder_went_quiet() {
    let server = Server::start_with(&["--runner-reap-every", "1s"]).await;
    let acme = tenant_token("acme");
    let requested = server.graphql(&acme, REQUEST, request_input("r-quiet", 30)).await;
    let lease = data(&requested)["requestRunnerLease"]["id"].clone();
    data(&server.graphql(&acme, ASSIGN, assign_input(&lease, 9, "a-quiet")).await);
    // Assigned but never launched: no compute to wait for, so the reap fails it and gives
    // its capacity back.
    eventually(&format!("runner lease {lease} reaped"), || async {
        let read = server.graphql(&acme, LEASE, json!({ "id": lease })).await;
        let read = &read["data"]["runnerLease"];
        (read["phase"] == "failed").then(|| read["failureReason"].clone())
    })
    .await;
    let capacity = server.graphql(&acme, CAPACITY, json!({})).await;
    assert_eq!(data(&capacity)["runnerCapacity"]["vcpu"], 0, "{capacity}");
}
