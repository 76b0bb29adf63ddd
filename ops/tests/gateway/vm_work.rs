//! `vmWork`: the agent of a host Leasehold does not call (no agent token registered) takes its
//! host's VM work by subscription and answers with the host agents' reports: a boot, then a
//! destroy, each naming its operation; resumed from a cursor with no duplicate; another
//! host's agent sees none of it; a tenant, and the agent of a host the dispatcher calls, are
//! refused.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fleet::{
    AGENT_TOKEN, CREATE, create_input, host_agent, register, register_at, wait_for_host,
    wait_for_state,
};
use crate::socket::Socket;
use crate::support::*;

const WORK: &str = "subscription($after: String) {
    vmWork(after: $after) { cursor vmId action generation operationId request }
}";

/// The next work item of operation `id`.
async fn item(socket: &mut Socket, id: &str) -> Value {
    let wait = Duration::from_secs(60);
    let message = tokio::time::timeout(wait, socket.message())
        .await
        .unwrap_or_else(|_| panic!("no VM work on {id} in {wait:?}"));
    assert_eq!(message["id"], id, "{message}");
    assert!(message["payload"].get("errors").is_none(), "{message}");
    message["payload"]["data"]["vmWork"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_agent_takes_its_hosts_vm_work_and_reports_on_it() {
    let server = Server::start().await;
    register(&server, "agent-1", 4).await;
    register(&server, "agent-2", 4).await;
    wait_for_host(&server, "agent-1").await;
    wait_for_host(&server, "agent-2").await;
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &host_agent("agent-1")).await;
    socket.subscribe("work", WORK, json!({})).await;
    let mut theirs = Socket::connect(&server, "graphql-transport-ws", &host_agent("agent-2")).await;
    theirs.subscribe("theirs", WORK, json!({})).await;

    let acme = tenant_token("acme");
    let mut pinned = create_input("c-1", "build-1");
    pinned["input"]["hostId"] = json!("agent-1");
    let created = server.graphql(&acme, CREATE, pinned).await;
    let id = data(&created)["createVm"]["id"].clone();
    let boot = item(&mut socket, "work").await;
    assert_eq!((boot["vmId"].clone(), boot["action"].as_str()), (id.clone(), Some("boot")));
    // A second boot, both still awaited: resumed after the first, the second comes, and the
    // first does not come again.
    let mut waiting = create_input("c-0", "build-0");
    waiting["input"]["hostId"] = json!("agent-1");
    let waiting = server.graphql(&acme, CREATE, waiting).await;
    let waiting = data(&waiting)["createVm"]["id"].clone();
    assert_eq!(item(&mut socket, "work").await["vmId"], waiting);
    let mut after_first =
        Socket::connect(&server, "graphql-transport-ws", &host_agent("agent-1")).await;
    after_first.subscribe("after", WORK, json!({ "after": boot["cursor"] })).await;
    assert_eq!(item(&mut after_first, "after").await["vmId"], waiting, "no gap, no duplicate");
    let name = format!("lh-{}", id.as_str().expect("an id"));
    assert_eq!(boot["request"]["agent"]["name"], name.as_str());
    assert_eq!(boot["request"]["agent"]["cpus"], 2);
    let report =
        "mutation($input: VmReportInput!) { reportVmBoot(input: $input) { events { type } } }";
    let booted = json!({ "input": { "vmId": id, "operationKey": "b-1", "operationId": boot["operationId"], "url": "10.0.0.9:19551" } });
    let answer = server.graphql(&host_agent("agent-1"), report, booted).await;
    assert_eq!(
        data(&answer)["reportVmBoot"]["events"],
        json!([{ "type": "VmRunning" }, { "type": "TaskRunning" }])
    );
    wait_for_state(&server, &acme, &id, "running").await;

    // Resumed after the first boot: the other's, then the destroy, and no first boot again.
    let mut resumed =
        Socket::connect(&server, "graphql-transport-ws", &host_agent("agent-1")).await;
    resumed.subscribe("again", WORK, json!({ "after": boot["cursor"] })).await;
    let destroy = "mutation($input: VmOperationInput!) { destroyVm(input: $input) { id } }";
    data(
        &server
            .graphql(&acme, destroy, json!({ "input": { "vmId": id, "operationKey": "d-1" } }))
            .await,
    );
    // (The other VM's boot, still awaited, comes first.)
    assert_eq!(item(&mut resumed, "again").await["vmId"], waiting);
    let removal = item(&mut resumed, "again").await;
    assert_eq!(
        (removal["vmId"].clone(), removal["action"].as_str()),
        (id.clone(), Some("destroy"))
    );
    assert_eq!(item(&mut socket, "work").await["action"], "destroy");
    let confirm =
        "mutation($input: VmReportInput!) { confirmVmRemoved(input: $input) { events { type } } }";
    let gone = json!({ "input": { "vmId": id, "operationKey": "r-1", "operationId": removal["operationId"] } });
    let answer = server.graphql(&host_agent("agent-1"), confirm, gone).await;
    assert_eq!(data(&answer)["confirmVmRemoved"]["events"], json!([{ "type": "VmRemoved" }]));
    wait_for_state(&server, &acme, &id, "destroyed").await;

    // The other host's agent was handed nothing of this host's: its first item is its own VM.
    let mut elsewhere = create_input("c-2", "build-2");
    elsewhere["input"]["hostId"] = json!("agent-2");
    let other = server.graphql(&acme, CREATE, elsewhere).await;
    let other = data(&other)["createVm"]["id"].clone();
    assert_eq!(item(&mut theirs, "theirs").await["vmId"], other);
    let read = wait_for_state(&server, &acme, &other, "provisioning").await;
    assert_eq!(read["data"]["vm"]["hostId"], "agent-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_agent_of_a_host_the_dispatcher_does_not_call_takes_work() {
    let server = Server::start().await;
    register_at(&server, "called", 4, ("http://127.0.0.1:9", Some(AGENT_TOKEN))).await;
    let acme = tenant_token("acme");
    let mut tenant = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    tenant.subscribe("work", WORK, json!({})).await;
    let refused = tenant.message().await;
    assert_eq!(refused["payload"][0]["extensions"]["code"], "FORBIDDEN", "{refused}");
    let mut called = Socket::connect(&server, "graphql-transport-ws", &host_agent("called")).await;
    called.subscribe("work", WORK, json!({})).await;
    let refused = called.message().await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["payload"][0]["extensions"]["code"], "BAD_USER_INPUT", "{refused}");
    assert!(!refused.to_string().contains(AGENT_TOKEN), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_boot_taken_as_work_carries_the_pull_of_its_seed_from_a_holder() {
    use crate::fleet::start_agent;
    let holder = start_agent(&[]).await;
    let server = Server::start().await;
    register_at(&server, "agent-1", 4, (&holder.url, Some(AGENT_TOKEN))).await;
    register(&server, "agent-2", 4).await;
    wait_for_host(&server, "agent-1").await;
    wait_for_host(&server, "agent-2").await;
    let acme = tenant_token("acme");
    let mut source = create_input("c-1", "build-1");
    source["input"]["hostId"] = json!("agent-1");
    let source = data(&server.graphql(&acme, CREATE, source).await)["createVm"]["id"].clone();
    wait_for_state(&server, &acme, &source, "running").await;
    let snapshot =
        "mutation($input: CreateSnapshotInput!) { createSnapshot(input: $input) { id } }";
    let input = json!({ "input": { "operationKey": "s-1", "vmId": source, "kind": "DISK" } });
    let seed = data(&server.graphql(&acme, snapshot, input).await)["createSnapshot"]["id"].clone();
    let digest = crate::backend::eventually("the seed being ready", || async {
        let read = "query($id: ID!) { snapshot(id: $id) { state digest } }";
        let answer = server.graphql(&acme, read, json!({ "id": seed })).await;
        let ready = answer["data"]["snapshot"]["state"] == "ready";
        ready.then(|| answer["data"]["snapshot"]["digest"].as_str().map(str::to_owned)).flatten()
    })
    .await;

    let mut socket = Socket::connect(&server, "graphql-transport-ws", &host_agent("agent-2")).await;
    socket.subscribe("work", WORK, json!({})).await;
    let mut seeded = create_input("c-2", "seeded-1");
    seeded["input"]["hostId"] = json!("agent-2");
    seeded["input"]["seedSnapshotId"] = seed.clone();
    let seeded = data(&server.graphql(&acme, CREATE, seeded).await)["createVm"]["id"].clone();
    let boot = item(&mut socket, "work").await;
    assert_eq!(boot["vmId"], seeded, "{boot}");
    let request = &boot["request"];
    assert_eq!(request["agent"]["seed_snapshot"], seed, "{request}");
    let pull = &request["seed_pull"];
    assert_eq!(
        (pull["peer_url"].as_str(), pull["digest"].as_str()),
        (Some(holder.url.as_str()), Some(digest.as_str()))
    );
    assert_eq!(pull["snapshot_id"], seed);
    // The grant reads that one blob from the holder's agent, and nothing else of it.
    let fetched = reqwest::Client::new()
        .get(format!("{}/v1/artifacts/{digest}", holder.url))
        .header("X-Fuse-Artifact-Grant", pull["grant"].as_str().expect("a grant"))
        .send()
        .await
        .expect("the holder answers");
    assert_eq!(fetched.status(), 200);
    let listed = reqwest::Client::new()
        .get(format!("{}/v1/vm?prefix=lh-", holder.url))
        .bearer_auth(pull["grant"].as_str().expect("a grant"))
        .send()
        .await
        .expect("the holder answers");
    assert_eq!(listed.status(), 401, "a grant is no token");
}
