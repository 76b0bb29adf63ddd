//! Snapshots through a real `leasehold serve`: a tenant snapshots its running VM, the host's
//! agent confirms it with the honest size, the tenant's quota counts it and an operator's
//! limit refuses the next with `QUOTA_EXCEEDED`; the seed's filters and Relay pages; no tenant
//! reaches another's snapshot, usage or artifacts.

use serde_json::{Value, json};

use crate::fleet::{CREATE, create_input, host_agent, register, wait_for_host};
use crate::support::*;

const SNAPSHOT: &str = "mutation($input: CreateSnapshotInput!) { createSnapshot(input: $input) { id version cursor events { type } } }";
const READ: &str = "query($id: ID!) { snapshot(id: $id) { id vmId state mode requested kind arch sizeBytes name layerKey digest } }";
const CONFIRM: &str = "mutation($input: ConfirmSnapshotInput!) { confirmSnapshot(input: $input) { id version cursor events { type } } }";
const DELETE: &str = "mutation($input: SnapshotOperationInput!) { deleteSnapshot(input: $input) { id version events { type } } }";
const QUOTA: &str = "mutation($input: SnapshotQuotaInput!) { setSnapshotQuota(input: $input) { id version cursor events { type } } }";
const USAGE: &str = "{ snapshotQuotaUsage { tenantId count bytes maxCount maxBytes } }";

const GIB: i64 = 1 << 30;

/// A running VM of acme's on agent-1: created, and its boot reported by the host's agent.
async fn running_vm(server: &Server) -> Value {
    register(server, "agent-1", 4).await;
    wait_for_host(server, "agent-1").await;
    let created = server.graphql(&tenant_token("acme"), CREATE, create_input("c-1", "t-1")).await;
    let vm = data(&created)["createVm"]["id"].clone();
    let boot =
        operation_of(server, &format!("vm-{}", vm.as_str().expect("an id")), "VmScheduled").await;
    let report = "mutation($input: VmReportInput!) { reportVmBoot(input: $input) { version } }";
    let input = json!({ "input": { "vmId": vm, "operationKey": "b-1", "operationId": boot, "url": "127.0.0.1:19551" } });
    let booted = server.graphql(&host_agent("agent-1"), report, input).await;
    assert!(data(&booted)["reportVmBoot"]["version"].is_number(), "{booted}");
    vm
}

/// The operation `event_type` on `stream` names, as the log holds it (an agent learns it
/// from its work; the tenant never sees it).
async fn operation_of(server: &Server, stream: &str, event_type: &str) -> String {
    let client = server.db.client().await;
    let row = client
        .query_one(
            "SELECT payload->>'operation' FROM events WHERE stream_id = $1 AND event_type = $2 \
             ORDER BY position DESC LIMIT 1",
            &[&stream, &event_type],
        )
        .await
        .expect("the operation's event");
    row.get(0)
}

fn ask(key: &str, vm: &Value, kind: &str) -> Value {
    json!({ "input": { "operationKey": key, "vmId": vm, "kind": kind } })
}

/// Reads acme's snapshot `id` once the projection reached `cursor`.
async fn read(server: &Server, id: &Value, cursor: &Value) -> Value {
    let request =
        json!({ "query": READ, "variables": { "id": id }, "extensions": { "minCursor": cursor } });
    let answer = server.graphql_with(&tenant_token("acme"), request).await;
    data(&answer)["snapshot"].clone()
}

/// The agent of agent-1 confirms snapshot `id` written as `kind` with these sizes.
async fn confirm(server: &Server, id: &Value, kind: &str, (disk, memory): (i64, i64)) -> Value {
    let operation = operation_of(
        server,
        &format!("snapshot-{}", id.as_str().expect("an id")),
        "SnapshotRequested",
    )
    .await;
    let input = json!({ "input": {
        "snapshotId": id, "operationKey": format!("w-{}", id.as_str().expect("an id")), "operationId": operation,
        "kind": kind, "diskBytes": disk, "memoryBytes": memory, "storeRef": "snap-a",
    }});
    let answer = server.graphql(&host_agent("agent-1"), CONFIRM, input).await;
    data(&answer)["confirmSnapshot"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_snapshots_its_vm_within_its_quota_and_the_agent_settles_the_honest_size() {
    let server = Server::start().await;
    let vm = running_vm(&server).await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, SNAPSHOT, ask("s-1", &vm, "LIVE")).await;
    let created = data(&created)["createSnapshot"].clone();
    assert_eq!(created["events"], json!([{ "type": "SnapshotRequested" }]));
    let snapshot = read(&server, &created["id"], &created["cursor"]).await;
    assert_eq!(
        (snapshot["state"].as_str(), snapshot["requested"].as_str(), snapshot["arch"].as_str()),
        (Some("creating"), Some("live"), Some("amd64")),
        "{snapshot}"
    );
    assert_eq!(snapshot["sizeBytes"], 10 * GIB + 2 * GIB, "the estimate: disk and memory");

    let confirmed = confirm(&server, &created["id"], "LIVE", (3 * GIB, 2 * GIB)).await;
    assert_eq!(confirmed["events"], json!([{ "type": "SnapshotCreated" }]), "{confirmed}");
    // The agent's cursor is sealed for the agent: the tenant waits (bounded) for the state.
    let snapshot = crate::backend::eventually("the snapshot being projected ready", || async {
        let answer = server.graphql(&acme, READ, json!({ "id": created["id"] })).await;
        let snapshot = data(&answer)["snapshot"].clone();
        (snapshot["state"] == "ready").then_some(snapshot)
    })
    .await;
    assert_eq!(
        (snapshot["state"].as_str(), snapshot["kind"].as_str()),
        (Some("ready"), Some("live"))
    );
    assert_eq!(snapshot["sizeBytes"], 5 * GIB, "the honest size counts memory");
    let settled = crate::backend::eventually("the quota settled to the honest size", || async {
        let usage = server.graphql(&acme, USAGE, json!({})).await;
        let usage = data(&usage)["snapshotQuotaUsage"].clone();
        (usage["bytes"] == 5 * GIB).then_some(usage)
    })
    .await;
    assert_eq!(settled["count"], 1, "{settled}");
    assert_eq!(settled["tenantId"], Value::Null, "a tenant's answer names no tenant");

    // An operator allows acme one snapshot: the next is refused, and nothing of it recorded.
    let operator = role_token(leasehold_gateway::Role::Operator, None);
    let limits = json!({ "input": { "tenantId": "acme", "maxCount": 1, "maxBytes": 0, "operationKey": "q-1" } });
    let set = server.graphql(&operator, QUOTA, limits.clone()).await;
    assert_eq!(data(&set)["setSnapshotQuota"]["events"], json!([{ "type": "QuotaLimitsSet" }]));
    assert_eq!(code(&server.graphql(&acme, QUOTA, limits).await), Some("FORBIDDEN"));
    let over = server.graphql(&acme, SNAPSHOT, ask("s-2", &vm, "DISK")).await;
    assert_eq!(code(&over), Some("QUOTA_EXCEEDED"), "{over}");
    let request = json!({ "query": "{ snapshotQuotaUsages { tenantId count maxCount } }", "extensions": { "minCursor": data(&set)["setSnapshotQuota"]["cursor"] } });
    let every = server.graphql_with(&operator, request).await;
    assert_eq!(
        data(&every)["snapshotQuotaUsages"],
        json!([{ "tenantId": "acme", "count": 1, "maxCount": 1 }])
    );
    // The tenant's quota view across kinds shows its snapshots against the limits.
    let across = crate::backend::eventually("quotaUsage showing the snapshot limits", || async {
        let usage = server
            .graphql(
                &acme,
                "{ quotaUsage { kind activeCount bytes maxCount maxBytes } }",
                json!({}),
            )
            .await;
        let kinds = data(&usage)["quotaUsage"].as_array().cloned().unwrap_or_default();
        kinds.into_iter().find(|kind| kind["kind"] == "snapshot" && kind["maxCount"] == 1)
    })
    .await;
    assert_eq!(
        across,
        json!({ "kind": "snapshot", "activeCount": 1, "bytes": 5 * GIB, "maxCount": 1, "maxBytes": 0 })
    );
    let theirs = server.graphql(&acme, "{ snapshotQuotaUsages { tenantId } }", json!({})).await;
    assert_eq!(code(&theirs), Some("FORBIDDEN"), "{theirs}");

    // Deleted once, deleted again with nothing recorded; its room is given back.
    let delete = json!({ "input": { "snapshotId": created["id"], "operationKey": "del-1" } });
    let deleted = server.graphql(&acme, DELETE, delete).await;
    assert_eq!(data(&deleted)["deleteSnapshot"]["events"], json!([{ "type": "SnapshotDeleting" }]));
    let again = json!({ "input": { "snapshotId": created["id"], "operationKey": "del-2" } });
    let again = server.graphql(&acme, DELETE, again).await;
    assert_eq!(data(&again)["deleteSnapshot"]["events"], json!([]), "{again}");
    let room = server.graphql(&acme, SNAPSHOT, ask("s-3", &vm, "DISK")).await;
    assert!(data(&room)["createSnapshot"]["id"].is_string(), "{room}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_listed_newest_first_by_the_seeds_filters_and_never_to_another_tenant() {
    let server = Server::start().await;
    let vm = running_vm(&server).await;
    let acme = tenant_token("acme");
    let mut last = Value::Null;
    for (n, (name, mode)) in [("a", "MANUAL"), ("b", "AUTO"), ("a", "BUILD")].iter().enumerate() {
        let mut input = ask(&format!("s-{n}"), &vm, "DISK");
        input["input"]["name"] = json!(name);
        input["input"]["mode"] = json!(mode);
        if *mode == "BUILD" {
            input["input"]["layerKey"] = json!("step:apt");
        }
        let created = server.graphql(&acme, SNAPSHOT, input).await;
        last = data(&created)["createSnapshot"].clone();
        assert!(last["id"].is_string(), "{created}");
    }
    let list = |filter: Value, first: i64, after: Value| {
        let query = "query($filter: SnapshotFilter, $first: Int, $after: String) { snapshots(filter: $filter, first: $first, after: $after) { edges { node { name mode layerKey } } pageInfo { hasNextPage endCursor } } }";
        let request = json!({ "query": query, "variables": { "filter": filter, "first": first, "after": after }, "extensions": { "minCursor": last["cursor"] } });
        let server = &server;
        let acme = acme.clone();
        async move { server.graphql_with(&acme, request).await }
    };
    let named = list(json!({ "name": "a" }), 20, Value::Null).await;
    let names: Vec<&str> = data(&named)["snapshots"]["edges"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|edge| edge["node"]["mode"].as_str())
        .collect();
    assert_eq!(names, ["build", "manual"], "newest first: {named}");
    let built =
        list(json!({ "mode": "BUILD", "layerKey": "step:apt", "arch": "amd64" }), 20, Value::Null)
            .await;
    assert_eq!(data(&built)["snapshots"]["edges"].as_array().map(Vec::len), Some(1), "{built}");
    let page = list(json!({ "vmId": vm }), 2, Value::Null).await;
    let info = &data(&page)["snapshots"]["pageInfo"];
    assert_eq!(info["hasNextPage"], true, "{page}");
    let rest = list(json!({ "vmId": vm }), 2, info["endCursor"].clone()).await;
    let rest = &data(&rest)["snapshots"];
    assert_eq!(
        (rest["edges"].as_array().map(Vec::len), &rest["pageInfo"]["hasNextPage"]),
        (Some(1), &json!(false))
    );

    // globex: not acme's snapshot by id, nor in its list, nor its layer, nor its usage.
    let globex = tenant_token("globex");
    let by_id = server.graphql(&globex, READ, json!({ "id": last["id"] })).await;
    assert_eq!(code(&by_id), Some("NOT_FOUND"), "{by_id}");
    let theirs = server
        .graphql(&globex, "{ snapshots { edges { node { id } } } snapshotQuotaUsage { count } layerArtifact(layerKey: \"step:apt\", arch: \"amd64\") { id } }", json!({}))
        .await;
    assert_eq!(data(&theirs)["snapshots"]["edges"], json!([]), "{theirs}");
    assert_eq!(data(&theirs)["snapshotQuotaUsage"], Value::Null, "{theirs}");
    assert_eq!(data(&theirs)["layerArtifact"], Value::Null, "{theirs}");
    let on_their_vm = server.graphql(&globex, SNAPSHOT, ask("s-9", &vm, "DISK")).await;
    assert_eq!(code(&on_their_vm), Some("NOT_FOUND"), "{on_their_vm}");
}

/// Waits (bounded) until acme reads snapshot `id` in `state`.
async fn wait_for(server: &Server, id: &Value, state: &str) -> Value {
    crate::backend::eventually(&format!("snapshot {id} becoming {state}"), || async {
        // Not found until the projection has it.
        let answer = server.graphql(&tenant_token("acme"), READ, json!({ "id": id })).await;
        let snapshot = answer["data"]["snapshot"].clone();
        (snapshot["state"] == state).then_some(snapshot)
    })
    .await
}

/// A simulated host agent (started with `agent_args`) registered as agent-1 of a real serve
/// (started with `serve_args`), and a VM of acme's running there, booted by the dispatcher.
async fn vm_at_a_simulated_agent(
    agent_args: &[&str],
    serve_args: &[&str],
) -> (crate::fleet::Agent, Server, Value) {
    use crate::fleet::{AGENT_TOKEN, register_at, start_agent, wait_for_state};
    let agent = start_agent(agent_args).await;
    let server = Server::start_with(serve_args).await;
    register_at(&server, "agent-1", 4, (&agent.url, Some(AGENT_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    let created = server.graphql(&acme, CREATE, create_input("c-1", "t-1")).await;
    let vm = data(&created)["createVm"]["id"].clone();
    wait_for_state(&server, &acme, &vm, "running").await;
    (agent, server, vm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_takes_restores_and_deletes_snapshots_at_the_hosts_agent() {
    let (agent, server, vm) = vm_at_a_simulated_agent(&[], &[]).await;
    let acme = tenant_token("acme");

    let taken = server.graphql(&acme, SNAPSHOT, ask("s-1", &vm, "LIVE")).await;
    let id = data(&taken)["createSnapshot"]["id"].clone();
    let ready = wait_for(&server, &id, "ready").await;
    assert_eq!(ready["kind"], "live", "{ready}");
    let digest = ready["digest"].as_str().expect("the agent's digest").to_owned();
    // The simulator's rootfs text and memory image: the honest size counts the memory.
    let rootfs = format!("rootfs of lh-{}", vm.as_str().expect("an id"));
    assert!(
        ready["sizeBytes"].as_i64().expect("a size")
            > i64::try_from(rootfs.len()).expect("small") + 4_000,
        "{ready}"
    );
    let hosts = server
        .graphql(&acme, "query($d: String!) { artifactHosts(digest: $d) }", json!({ "d": digest }))
        .await;
    assert_eq!(data(&hosts)["artifactHosts"], json!(["agent-1"]), "{hosts}");

    // A build layer, once its agent wrote it, is a layer cache hit for its tenant only.
    let mut layer = ask("l-1", &vm, "DISK");
    layer["input"]["mode"] = json!("BUILD");
    layer["input"]["layerKey"] = json!("step:apt");
    let layer = server.graphql(&acme, SNAPSHOT, layer).await;
    let layer_id = data(&layer)["createSnapshot"]["id"].clone();
    wait_for(&server, &layer_id, "ready").await;
    let used = "mutation($input: UseLayerInput!) { useLayerArtifact(input: $input) { id events { type } } }";
    let hit =
        json!({ "input": { "layerKey": "step:apt", "arch": "amd64", "operationKey": "u-1" } });
    let answer = server.graphql(&acme, used, hit.clone()).await;
    assert_eq!(data(&answer)["useLayerArtifact"]["id"], layer_id, "{answer}");
    assert_eq!(data(&answer)["useLayerArtifact"]["events"], json!([{ "type": "SnapshotUsed" }]));
    let theirs = server.graphql(&tenant_token("globex"), used, hit).await;
    assert_eq!(data(&theirs)["useLayerArtifact"], Value::Null, "{theirs}");

    // An export is recorded pending and sent to the host's agent on Leasehold's export route,
    // whose answer settles it; a report naming another operation is fenced, the same one again
    // is a redelivery, the opposite one a conflict, and a tenant reports nothing.
    let export = "mutation($input: ExportSnapshotInput!) { exportSnapshot(input: $input) { events { type } } }";
    let to = "s3://backups/acme/snap-1";
    let input = json!({ "input": { "snapshotId": id, "destination": to, "operationKey": "x-1" } });
    let asked = server.graphql(&acme, export, input).await;
    assert_eq!(
        data(&asked)["exportSnapshot"]["events"],
        json!([{ "type": "SnapshotExportRequested" }])
    );
    let presigned = json!({ "input": { "snapshotId": id, "destination": "https://b/k?X-Amz-Signature=abc", "operationKey": "x-2" } });
    assert_eq!(code(&server.graphql(&acme, export, presigned).await), Some("BAD_USER_INPUT"));
    let exported = crate::backend::eventually("the export being projected ready", || async {
        let answer = server
            .graphql(
                &acme,
                "query($id: ID!) { snapshot(id: $id) { exports } }",
                json!({ "id": id }),
            )
            .await;
        let exports = answer["data"]["snapshot"]["exports"].clone();
        (exports[0]["status"] == "ready").then_some(exports)
    })
    .await;
    assert_eq!(exported[0]["destination"], to);
    assert_eq!(agent.count("export").await, 1, "sent once to the host's agent");
    let client = server.db.client().await;
    let stream = format!("snapshot-{}", id.as_str().expect("an id"));
    let row = client
        .query_one(
            "SELECT payload->>'operation' FROM events WHERE stream_id = $1 \
             AND event_type = 'SnapshotExportRequested'",
            &[&stream],
        )
        .await
        .expect("readable");
    let operation: String = row.get(0);
    let report = "mutation($input: SnapshotExportReportInput!) { reportSnapshotExport(input: $input) { events { type } } }";
    let again = |operation: &str, key: &str| json!({ "input": { "snapshotId": id, "operationId": operation, "destination": to, "ready": true, "operationKey": key } });
    let stale = server
        .graphql(&host_agent("agent-1"), report, again(&uuid::Uuid::nil().to_string(), "xr-1"))
        .await;
    assert_eq!(code(&stale), Some("FENCED"), "{stale}");
    let redelivered =
        server.graphql(&host_agent("agent-1"), report, again(&operation, "xr-2")).await;
    assert_eq!(data(&redelivered)["reportSnapshotExport"]["events"], json!([]), "{redelivered}");
    let mut contradicting = again(&operation, "xr-4");
    contradicting["input"]["ready"] = json!(false);
    let contradicting = server.graphql(&host_agent("agent-1"), report, contradicting).await;
    assert_eq!(code(&contradicting), Some("CONFLICT"), "{contradicting}");
    let tenant = server.graphql(&acme, report, again(&operation, "xr-3")).await;
    assert_eq!(code(&tenant), Some("FORBIDDEN"));

    let restore = "mutation($input: RestoreSnapshotInput!) { restoreSnapshot(input: $input) { events { type } } }";
    let input = json!({ "input": { "snapshotId": id, "vmId": vm, "operationKey": "r-1" } });
    let restoring = server.graphql(&acme, restore, input).await;
    assert_eq!(
        data(&restoring)["restoreSnapshot"]["events"],
        json!([{ "type": "SnapshotRestoring" }])
    );
    crate::backend::eventually("the restore being confirmed", || async {
        let stream = format!("snapshot-{}", id.as_str().expect("an id"));
        let row = client
            .query_one("SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'SnapshotRestored'", &[&stream])
            .await
            .expect("readable");
        (row.get::<_, i64>(0) == 1).then_some(())
    })
    .await;

    let delete = json!({ "input": { "snapshotId": id, "operationKey": "del-1" } });
    data(&server.graphql(&acme, DELETE, delete).await);
    wait_for(&server, &id, "deleted").await;
    // fuse's agent has no snapshot delete route: its 404 is recorded as the provider's
    // not-found, a deletion too.
    let row = client
        .query_one(
            "SELECT payload->>'not_found' FROM events WHERE stream_id = $1 AND event_type = 'SnapshotDeleted'",
            &[&format!("snapshot-{}", id.as_str().expect("an id"))],
        )
        .await
        .expect("a deletion");
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("true"));
}

/// acme's snapshot's exports, as projected.
async fn exports_of(server: &Server, id: &Value) -> Value {
    let read = "query($id: ID!) { snapshot(id: $id) { exports } }";
    server.graphql(&tenant_token("acme"), read, json!({ "id": id })).await["data"]["snapshot"]
        ["exports"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_the_agent_takes_on_is_reported_later_or_lapses_into_an_error() {
    let serve = ["--snapshot-export-within", "15s"];
    let (agent, server, vm) = vm_at_a_simulated_agent(&["--export-later"], &serve).await;
    let acme = tenant_token("acme");
    let taken = server.graphql(&acme, SNAPSHOT, ask("s-1", &vm, "DISK")).await;
    let id = data(&taken)["createSnapshot"]["id"].clone();
    wait_for(&server, &id, "ready").await;

    // Two exports at once, to two destinations: each is sent (neither supersedes the other).
    let export =
        "mutation($input: ExportSnapshotInput!) { exportSnapshot(input: $input) { version } }";
    for (key, to) in [("x-1", "s3://backups/one"), ("x-2", "s3://backups/two")] {
        let input =
            json!({ "input": { "snapshotId": id, "destination": to, "operationKey": key } });
        assert!(
            data(&server.graphql(&acme, export, input).await)["exportSnapshot"]["version"]
                .is_number()
        );
    }
    crate::backend::eventually("both exports sent to the agent", || async {
        (agent.count("export").await == 2).then_some(())
    })
    .await;
    // The agent reports the first later, naming its operation.
    let stream = format!("snapshot-{}", id.as_str().expect("an id"));
    let client = server.db.client().await;
    let row = client
        .query_one(
            "SELECT payload->>'operation' FROM events WHERE stream_id = $1 \
             AND event_type = 'SnapshotExportRequested' AND payload->>'destination' = $2",
            &[&stream, &"s3://backups/one"],
        )
        .await
        .expect("the first export's request");
    let operation: String = row.get(0);
    let report = "mutation($input: SnapshotExportReportInput!) { reportSnapshotExport(input: $input) { events { type } } }";
    let done = json!({ "input": { "snapshotId": id, "operationId": operation, "destination": "s3://backups/one", "ready": true, "operationKey": "xr-1" } });
    let reported = server.graphql(&host_agent("agent-1"), report, done).await;
    assert_eq!(
        data(&reported)["reportSnapshotExport"]["events"],
        json!([{ "type": "SnapshotExported" }])
    );
    // The second is never reported: past its deadline, it is the export's error.
    let settled = crate::backend::eventually("the unreported export lapsing", || async {
        let exports = exports_of(&server, &id).await;
        let statuses: Vec<&str> =
            exports.as_array()?.iter().filter_map(|e| e["status"].as_str()).collect();
        (statuses == ["ready", "error"]).then_some(exports)
    })
    .await;
    assert_eq!(settled[1]["destination"], "s3://backups/two", "{settled}");
}
