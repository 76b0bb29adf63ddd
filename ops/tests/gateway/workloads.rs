//! One workload list and one event feed across every kind, through a real `leasehold serve`:
//! a tenant with a lease, a VM, a rental, a run and a runner lease sees all five in
//! `workloads` in one shape, each with its kind's own detail, in pages, filtered by kind and
//! by state, and none of another tenant's; and their events in `events` and on a
//! `lifecycleEvents` subscription, filtered by kind, stream and event type, each through its
//! tenant view. Operators set limits on each kind as events and `quotaUsage` shows each kind
//! against them.

use std::collections::BTreeSet;

use leasehold_gateway::Role;
use serde_json::{Value, json};

use crate::backend::eventually;
use crate::fleet::{CREATE, create_input, register, wait_for_host};
use crate::rented::{SUBMIT, active_rental, rented_server};
use crate::runners::{ASSIGN, request};
use crate::socket::{LIFECYCLE, Socket};
use crate::support::*;

const PAGE: &str = "query($after: String, $filter: WorkloadFilter) {
    workloads(first: 2, after: $after, filter: $filter) {
        edges { node { id kind state resources { sku quantity } createdAt
            detail { __typename ... on RunnerLease { phase tier } ... on Rental { offerId }
                     ... on Run { rentalId } ... on Vm { taskId } ... on Lease { status } } } }
        pageInfo { hasNextPage endCursor } } }";

/// Every workload `token` sees under `filter`, page by page (2 a page), newest first.
async fn every_page(server: &Server, token: &str, filter: Value) -> Vec<Value> {
    let mut nodes = Vec::new();
    let mut after = Value::Null;
    loop {
        let variables = json!({ "after": after, "filter": filter });
        let page = server.graphql(token, PAGE, variables).await;
        let workloads = data(&page)["workloads"].clone();
        let edges = workloads["edges"].as_array().cloned().unwrap_or_default();
        nodes.extend(edges.into_iter().map(|edge| edge["node"].clone()));
        if workloads["pageInfo"]["hasNextPage"] != true {
            return nodes;
        }
        after = workloads["pageInfo"]["endCursor"].clone();
    }
}

fn kinds(nodes: &[Value]) -> BTreeSet<String> {
    nodes.iter().map(|node| node["kind"].as_str().unwrap_or_default().to_string()).collect()
}

/// A server where acme holds one workload of each kind (its runner lease assigned) and
/// globex one lease: the server, its providers file's directory, globex's lease and acme's
/// runner lease.
async fn five_kinds() -> (Server, TempDir, Value, Value) {
    let (server, _dir) = rented_server().await;
    register(&server, "agent-1", 4).await;
    wait_for_host(&server, "agent-1").await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let theirs = request_lease(&server, &globex, "g-lease").await;
    request_lease(&server, &acme, "lease-1").await;
    data(&server.graphql(&acme, CREATE, create_input("vm-1", "build-1")).await);
    let rental = active_rental(&server, &acme, "rental-1").await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "a".repeat(64)), "maxRuntimeSeconds": 3600,
    }});
    data(&server.graphql(&acme, SUBMIT, submit).await);
    let runner = request(&server, &acme, "runner-1").await;
    let job = uuid::Uuid::from_u128(1).to_string();
    let assign = json!({ "input": {
        "leaseId": runner, "operationKey": "a-1", "requestId": job, "runId": 1 } });
    data(&server.graphql(&acme, ASSIGN, assign).await);
    (server, _dir, theirs, runner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_a_workload_of_every_kind_in_one_list() {
    let (server, _dir, theirs, runner) = five_kinds().await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let every = ["lease", "rental", "run", "runner", "vm"].map(String::from);
    let nodes = eventually("acme's five workloads listed, the runner assigned", || async {
        let nodes = every_page(&server, &acme, Value::Null).await;
        let runner_assigned =
            nodes.iter().any(|n| n["kind"] == "runner" && n["state"] == "assigned");
        (nodes.len() == 5 && runner_assigned).then_some(nodes)
    })
    .await;
    assert_eq!(kinds(&nodes), BTreeSet::from(every.clone()), "{nodes:?}");
    // Newest first, each once, and each with its own kind's detail.
    let created: Vec<&str> = nodes.iter().filter_map(|n| n["createdAt"].as_str()).collect();
    assert!(created.windows(2).all(|pair| pair[0] >= pair[1]), "newest first: {created:?}");
    for node in &nodes {
        let typename = match node["kind"].as_str() {
            Some("lease") => "Lease",
            Some("vm") => "Vm",
            Some("rental") => "Rental",
            Some("run") => "Run",
            _ => "RunnerLease",
        };
        assert_eq!(node["detail"]["__typename"], typename, "{node}");
        assert_ne!(node["id"], theirs["id"], "another tenant's lease is not listed");
    }
    let listed = nodes.iter().find(|n| n["kind"] == "runner").expect("the runner lease");
    assert_eq!(listed["id"], runner);
    assert_eq!(
        listed["resources"],
        json!([{ "sku": "runner.vcpu", "quantity": 4 }, { "sku": "runner.memory_mb", "quantity": 8192 }])
    );
    assert_eq!(
        listed["detail"],
        json!({ "__typename": "RunnerLease", "phase": "assigned", "tier": "linux-4x" })
    );
    // Filtered by kind, and by kind and state.
    for kind in &every {
        let only = every_page(&server, &acme, json!({ "kind": kind })).await;
        assert_eq!(kinds(&only), BTreeSet::from([kind.clone()]), "{kind}: {only:?}");
        assert_eq!(only.len(), 1, "{kind}");
        let state = only[0]["state"].clone();
        let same = every_page(&server, &acme, json!({ "kind": kind, "state": state })).await;
        assert_eq!(same, only, "{kind} in its state");
    }
    let none = every_page(&server, &acme, json!({ "kind": "runner", "state": "busy" })).await;
    assert_eq!(none, Vec::<Value>::new());
    // The other tenant sees its own lease only.
    let others = every_page(&server, &globex, Value::Null).await;
    let ids: Vec<&Value> = others.iter().map(|node| &node["id"]).collect();
    assert_eq!(ids, [&theirs["id"]], "{others:?}");
}

const EVENTS: &str = "query($filter: EventFilter) { events(first: 100, filter: $filter) {
    edges { cursor node { streamId streamType type payload tenantId } } } }";

/// `token`'s events under `filter`, as (stream type, event type, stream id, payload).
async fn events(
    server: &Server,
    token: &str,
    filter: Value,
) -> Vec<(String, String, String, Value)> {
    let answer = server.graphql(token, EVENTS, json!({ "filter": filter })).await;
    let edges = data(&answer)["events"]["edges"].as_array().cloned().unwrap_or_default();
    edges
        .iter()
        .map(|edge| {
            let node = &edge["node"];
            let text = |field: &str| node[field].as_str().unwrap_or_default().to_string();
            (text("streamType"), text("type"), text("streamId"), node["payload"].clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_follows_every_kind_in_one_event_feed() {
    let (server, _dir, _theirs, runner) = five_kinds().await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    // One feed across every kind, each event through its tenant view. (The log is read up
    // to its gap-safe horizon: a transaction still open elsewhere holds later events back
    // for a moment, so the feed is read until the last kind's events show.)
    let every = ["lease", "vm", "rental", "run", "runner-lease", "runner-job", "workload-quota"];
    let all = eventually("every kind's events in acme's feed", || async {
        let all = events(&server, &acme, Value::Null).await;
        let kinds: BTreeSet<&str> = all.iter().map(|(kind, ..)| kind.as_str()).collect();
        every.iter().all(|kind| kinds.contains(kind)).then_some(all)
    })
    .await;
    let runner_stream = format!("runner-lease-{}", runner.as_str().expect("an id"));
    let requested = all
        .iter()
        .find(|(_, kind, stream, _)| kind == "RunnerLeaseRequested" && *stream == runner_stream);
    let payload = &requested.expect("the runner lease's request").3;
    assert_eq!(payload["terms"]["tier"], "linux-4x", "{payload}");
    assert!(
        payload.get("epoch").is_none() && payload["terms"].get("command").is_none(),
        "{payload}"
    );
    assert!(all.iter().all(|(.., payload)| payload.get("tenantId").is_none()));
    // Filtered by kind, by stream and by event type, across kinds.
    let by_kind = events(&server, &acme, json!({ "streamTypes": ["vm", "runner-lease"] })).await;
    let kinds: BTreeSet<&str> = by_kind.iter().map(|(kind, ..)| kind.as_str()).collect();
    assert_eq!(kinds, BTreeSet::from(["runner-lease", "vm"]));
    let by_stream = events(&server, &acme, json!({ "streamIds": [runner_stream] })).await;
    let types: Vec<&str> = by_stream.iter().map(|(_, kind, ..)| kind.as_str()).collect();
    assert_eq!(types, ["RunnerLeaseRequested", "RunnerJobAssigned"]);
    let filter =
        json!({ "eventTypes": ["RunnerJobAssigned", "VmProvisioning", "CapacityRequested"] });
    let by_type = events(&server, &acme, filter).await;
    let types: BTreeSet<&str> = by_type.iter().map(|(_, kind, ..)| kind.as_str()).collect();
    assert_eq!(types, BTreeSet::from(["CapacityRequested", "RunnerJobAssigned", "VmProvisioning"]));
    // The other tenant's feed holds its own lease only, and its lease quota's reservation of
    // that lease.
    let theirs = events(&server, &globex, Value::Null).await;
    let kinds: BTreeSet<&str> = theirs.iter().map(|(kind, ..)| kind.as_str()).collect();
    assert_eq!(kinds, BTreeSet::from(["lease", "workload-quota"]), "{theirs:?}");
    let lease = theirs.iter().find(|(kind, ..)| kind == "lease").expect("its lease");
    for (.., payload) in theirs.iter().filter(|(kind, ..)| kind == "workload-quota") {
        assert_eq!(payload["workload"].as_str(), Some(lease.2.as_str()), "{payload}");
    }
    // A subscription after the first of them, filtered across kinds, replays the rest.
    let filter = json!({ "streamTypes": ["vm", "runner-lease"] });
    let answer = server.graphql(&acme, EVENTS, json!({ "filter": filter })).await;
    let first = data(&answer)["events"]["edges"][0]["cursor"].clone();
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    socket.subscribe("feed", LIFECYCLE, json!({ "filter": filter, "after": first })).await;
    for (kind, event_type, stream, payload) in &by_kind[1..] {
        let event = socket.event("feed").await;
        assert_eq!(
            (event["streamType"].as_str(), event["type"].as_str(), event["streamId"].as_str()),
            (Some(kind.as_str()), Some(event_type.as_str()), Some(stream.as_str()))
        );
        assert_eq!(&event["payload"], payload, "the same tenant view");
    }
}

const SET_LIMITS: &str = "mutation($input: SetWorkloadLimitsInput!) {
    setWorkloadLimits(input: $input) { id version } }";

const QUOTA: &str = "{ quotaUsage { kind activeCount limits { resource used max } } }";

/// Sets `tenant`'s limits on `kind` as an operator; the answer.
async fn set_limits(
    server: &Server,
    token: &str,
    tenant: &str,
    kind: &str,
    limits: Value,
) -> Value {
    let input = json!({ "input": {
        "tenantId": tenant, "kind": kind, "operationKey": format!("limits-{kind}"), "limits": limits,
    }});
    server.graphql(token, SET_LIMITS, input).await
}

/// The limits of `kind` in a `quotaUsage` answer, as (resource, used, max).
fn limits_of(usage: &Value, kind: &str) -> Vec<(String, u64, u64)> {
    let kinds = usage.as_array().cloned().unwrap_or_default();
    let Some(entry) = kinds.into_iter().find(|entry| entry["kind"] == kind) else {
        return Vec::new();
    };
    let limits = entry["limits"].as_array().cloned().unwrap_or_default();
    limits
        .iter()
        .map(|limit| {
            let resource = limit["resource"].as_str().unwrap_or_default().to_string();
            (resource, limit["used"].as_u64().unwrap_or(0), limit["max"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// Operators set a count limit of one on each of acme's kinds (and a GPU limit on its
/// leases); acme then holds one workload of each: `quotaUsage` shows each kind against its
/// limits, a second workload of any kind is `QUOTA_EXCEEDED` with nothing appended, and
/// neither a tenant nor a resource the kind never holds sets a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_usage_shows_each_kind_against_its_limit() {
    let (server, _dir) = rented_server().await;
    register(&server, "agent-1", 4).await;
    wait_for_host(&server, "agent-1").await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let operator = role_token(Role::Operator, None);
    let count = json!([{ "resource": "count", "max": 1 }]);
    for kind in ["vm", "rental", "run"] {
        data(&set_limits(&server, &operator, "acme", kind, count.clone()).await);
    }
    let lease_limits =
        json!([{ "resource": "count", "max": 1 }, { "resource": "sku.gpu.h100.1x", "max": 2 }]);
    data(&set_limits(&server, &operator, "acme", "lease", lease_limits).await);
    // Neither a tenant, nor a resource the kind never holds, nor an unknown kind.
    let own = set_limits(&server, &acme, "acme", "lease", json!([])).await;
    assert_eq!(code(&own), Some("FORBIDDEN"), "{own}");
    let bad = json!([{ "resource": "cpus", "max": 1 }]);
    let refused = set_limits(&server, &operator, "acme", "lease", bad).await;
    assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    let unknown = set_limits(&server, &operator, "acme", "snapshots", json!([])).await;
    assert_eq!(code(&unknown), Some("BAD_USER_INPUT"), "{unknown}");
    // One of each kind, then a second of each refused.
    request_lease(&server, &acme, "lease-1").await;
    data(&server.graphql(&acme, CREATE, create_input("vm-1", "build-1")).await);
    let rental = active_rental(&server, &acme, "rental-1").await;
    let submit = |key: &str| {
        json!({ "input": {
            "operationKey": key, "rentalId": rental,
            "manifestDigest": format!("sha256:{}", "a".repeat(64)), "maxRuntimeSeconds": 3600,
        }})
    };
    data(&server.graphql(&acme, SUBMIT, submit("run-1")).await);
    let second_lease = server.graphql(&acme, REQUEST_LEASE, lease_request("lease-2")).await;
    assert_eq!(code(&second_lease), Some("QUOTA_EXCEEDED"), "{second_lease}");
    let message = second_lease["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at most 1 of lease.count"), "{message}");
    // The refusal says what refused, never the internal stream it was decided on.
    assert!(!message.contains("workload-quota-") && !message.contains("linked"), "{message}");
    let second_vm = server.graphql(&acme, CREATE, create_input("vm-2", "build-2")).await;
    assert_eq!(code(&second_vm), Some("QUOTA_EXCEEDED"), "{second_vm}");
    let second_run = server.graphql(&acme, SUBMIT, submit("run-2")).await;
    assert_eq!(code(&second_run), Some("QUOTA_EXCEEDED"), "{second_run}");
    // Each kind against its limits, the tenant's own view and the operator's of it alike.
    let expected = |kind: &str| (format!("{kind}.count"), 1, 1);
    let usage = eventually("acme's four kinds counted against their limits", || async {
        let usage = data(&server.graphql(&acme, QUOTA, json!({})).await)["quotaUsage"].clone();
        let counted = ["lease", "vm", "rental", "run"]
            .iter()
            .all(|kind| limits_of(&usage, kind).contains(&expected(kind)));
        counted.then_some(usage)
    })
    .await;
    assert_eq!(
        limits_of(&usage, "lease"),
        [("lease.count".to_string(), 1, 1), ("lease.sku.gpu.h100.1x".to_string(), 1, 2)]
    );
    assert_eq!(
        limits_of(&usage, "vm"),
        [
            ("vm.count".to_string(), 1, 1),
            ("vm.cpus".to_string(), 2, 0),
            ("vm.ram_mb".to_string(), 2048, 0)
        ]
    );
    assert!(limits_of(&usage, "rental").contains(&("rental.gpus".to_string(), 1, 0)));
    assert!(limits_of(&usage, "run").contains(&("run.max_runtime_seconds".to_string(), 3600, 0)));
    let theirs = "query($t: String!) { tenantQuotaUsage(tenantId: $t) { kind activeCount limits { resource used max } } }";
    let seen = server.graphql(&operator, theirs, json!({ "t": "acme" })).await;
    assert_eq!(data(&seen)["tenantQuotaUsage"], usage);
    let denied = server.graphql(&globex, theirs, json!({ "t": "acme" })).await;
    assert_eq!(code(&denied), Some("FORBIDDEN"), "{denied}");
    // Another tenant has no limits and holds nothing of acme's.
    let others = data(&server.graphql(&globex, QUOTA, json!({})).await)["quotaUsage"].clone();
    assert_eq!(others, json!([]), "{others}");
}
