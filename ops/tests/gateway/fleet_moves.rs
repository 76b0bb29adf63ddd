//! Forks and migrations through a real `leasehold serve` and two simulated host agents (each
//! with its own token): a fork boots beside its source on the source's agent; a migration's
//! copy boots on the other agent from a snapshot the target pulled from the source's (with a
//! grant of the source host's token), then the source is destroyed there; a copy that fails
//! leaves its source running as it was. An unpinned VM seeded from a snapshot boots where
//! placement puts it, its host's agent pulling the seed from a holder's first; locality
//! breaks a tie toward a holder.

use serde_json::{Value, json};

use crate::backend::eventually;
use crate::fleet::{
    AGENT_TOKEN, Agent, CREATE, agent_vms, create_input, register_at, start_agent_with,
    wait_for_host, wait_for_state,
};
use crate::support::*;

const OTHER_TOKEN: &str = "fc-agent-token-of-the-second-host";
const FORK: &str = "mutation($input: ForkVmInput!) { forkVm(input: $input) { copyId source { id events { type } } } }";
const MIGRATE: &str = "mutation($input: MigrateVmInput!) { migrateVm(input: $input) { copyId source { id events { type } } } }";

/// Two hosts, each with its own agent; a VM of acme's running on agent-1.
async fn fleet_with_a_running_vm(second: &[&str]) -> (Server, Agent, Agent, Value) {
    let (one, two) =
        (start_agent_with(AGENT_TOKEN, &[]).await, start_agent_with(OTHER_TOKEN, second).await);
    let server = Server::start().await;
    register_at(&server, "agent-1", 4, (&one.url, Some(AGENT_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    let acme = tenant_token("acme");
    // Not pinned (a pinned VM stays on its pin): on agent-1, the only host yet.
    let created = server.graphql(&acme, CREATE, create_input("c-1", "build-1")).await;
    let id = data(&created)["createVm"]["id"].clone();
    wait_for_state(&server, &acme, &id, "running").await;
    register_at(&server, "agent-2", 4, (&two.url, Some(OTHER_TOKEN))).await;
    wait_for_host(&server, "agent-2").await;
    (server, one, two, id)
}

fn names(listed: &Value) -> Vec<String> {
    let vms = listed["vms"].as_array().cloned().unwrap_or_default();
    let mut names: Vec<String> =
        vms.iter().filter_map(|vm| vm["vm_id"].as_str().map(str::to_owned)).collect();
    names.sort();
    names
}

fn agent_name(id: &Value) -> String {
    format!("lh-{}", id.as_str().expect("an id"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_boots_beside_its_source_and_a_migration_moves_it_to_the_other_host() {
    let (server, one, two, source) = fleet_with_a_running_vm(&[]).await;
    let acme = tenant_token("acme");
    let input =
        json!({ "input": { "vmId": source, "taskId": "build-1-fork", "operationKey": "f-1" } });
    let forked = server.graphql(&acme, FORK, input).await;
    let forked = &data(&forked)["forkVm"];
    assert_eq!(forked["source"]["events"], json!([{ "type": "VmForked" }]), "{forked}");
    let fork = forked["copyId"].clone();
    let running = wait_for_state(&server, &acme, &fork, "running").await;
    let copies = "query($id: ID!) { vm(id: $id) { copiedFrom copyKind } }";
    let copied = server.graphql(&acme, copies, json!({ "id": fork })).await;
    assert_eq!(data(&copied)["vm"], json!({ "copiedFrom": source, "copyKind": "fork" }));
    assert_eq!(running["data"]["vm"]["hostId"], "agent-1");
    let mut beside = vec![agent_name(&source), agent_name(&fork)];
    beside.sort();
    assert_eq!(names(&agent_vms(&one).await), beside, "the fork runs beside its source");

    let input = json!({ "input": { "vmId": source, "operationKey": "m-1" } });
    let moved = server.graphql(&acme, MIGRATE, input).await;
    let moved = &data(&moved)["migrateVm"];
    assert_eq!(moved["source"]["events"], json!([{ "type": "VmMigrating" }]), "{moved}");
    let copy = moved["copyId"].clone();
    let running = wait_for_state(&server, &acme, &copy, "running").await;
    let copies = "query($id: ID!) { vm(id: $id) { copiedFrom copyKind migratingTo taskState } }";
    let copied = server.graphql(&acme, copies, json!({ "id": copy })).await;
    assert_eq!(
        data(&copied)["vm"],
        json!({ "copiedFrom": source, "copyKind": "migration", "migratingTo": null, "taskState": "running" })
    );
    assert_eq!(running["data"]["vm"]["hostId"], "agent-2");
    assert_eq!(running["data"]["vm"]["taskId"], "build-1", "the task moves with its VM");
    let gone = wait_for_state(&server, &acme, &source, "destroyed").await;
    assert_eq!(gone["data"]["vm"]["destroyReason"], "migrated");
    let moved_task = "query($id: ID!) { vm(id: $id) { taskState migratingTo } }";
    let source_read = server.graphql(&acme, moved_task, json!({ "id": source })).await;
    assert_eq!(data(&source_read)["vm"], json!({ "taskState": "moved", "migratingTo": null }));
    assert_eq!(names(&agent_vms(&two).await), vec![agent_name(&copy)]);
    eventually("the source gone from its agent", || async {
        (names(&agent_vms(&one).await) == vec![agent_name(&fork)]).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_whose_copy_fails_leaves_its_source_running_as_it_was() {
    let (server, one, _two, source) = fleet_with_a_running_vm(&["--fail-boots"]).await;
    let acme = tenant_token("acme");
    let before = wait_for_state(&server, &acme, &source, "running").await;
    let input =
        json!({ "input": { "vmId": source, "operationKey": "m-1", "targetHostId": "agent-2" } });
    let moved = server.graphql(&acme, MIGRATE, input).await;
    let copy = data(&moved)["migrateVm"]["copyId"].clone();
    let failed = wait_for_state(&server, &acme, &copy, "failed").await;
    assert_eq!(failed["data"]["vm"]["reason"], "BootFailed");
    let after = wait_for_state(&server, &acme, &source, "running").await;
    assert_eq!(after["data"]["vm"]["url"], before["data"]["vm"]["url"]);
    assert_eq!(names(&agent_vms(&one).await), vec![agent_name(&source)]);
    // Live is refused before anything is appended: no agent moves memory between hosts.
    let live = json!({ "input": { "vmId": source, "operationKey": "m-2", "live": true, "targetHostId": "agent-2" } });
    let refused = server.graphql(&acme, MIGRATE, live).await;
    assert_eq!(code(&refused), Some("INVALID_STATE"), "{refused}");
    assert!(refused.to_string().contains("never falls back to a cold one"), "{refused}");
    // Its migration was abandoned: the VM may be drained now (refused while migrating).
    let drain =
        "mutation($input: VmOperationInput!) { drainVm(input: $input) { events { type } } }";
    let drained = eventually("the migration abandoned", || async {
        let answer = server
            .graphql(&acme, drain, json!({ "input": { "vmId": source, "operationKey": "dr-1" } }))
            .await;
        answer["data"]["drainVm"]["events"].as_array().is_some().then_some(answer)
    })
    .await;
    assert_eq!(drained["data"]["drainVm"]["events"], json!([{ "type": "VmDraining" }]));
}

/// Whether the placement of `vm`'s boot found its seed on the chosen host, as the log says.
async fn artifact_local(server: &Server, vm: &Value) -> bool {
    let client = server.db.client().await;
    let row = client
        .query_one(
            "SELECT (payload->'placement'->>'artifact_local')::bool FROM events \
             WHERE stream_id = $1 AND event_type = 'VmScheduled'",
            &[&format!("vm-{}", vm.as_str().expect("an id"))],
        )
        .await
        .expect("the VM's placement");
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpinned_seeded_vm_boots_where_placement_says_pulling_its_seed_and_locality_breaks_ties()
 {
    // Both hosts known to placement from the start; the seed's VM pinned to agent-1.
    let (one, two) =
        (start_agent_with(AGENT_TOKEN, &[]).await, start_agent_with(OTHER_TOKEN, &[]).await);
    let server = Server::start().await;
    register_at(&server, "agent-1", 4, (&one.url, Some(AGENT_TOKEN))).await;
    register_at(&server, "agent-2", 4, (&two.url, Some(OTHER_TOKEN))).await;
    wait_for_host(&server, "agent-1").await;
    wait_for_host(&server, "agent-2").await;
    let acme = tenant_token("acme");
    let mut pinned = create_input("c-1", "build-1");
    pinned["input"]["hostId"] = json!("agent-1");
    let created = server.graphql(&acme, CREATE, pinned).await;
    let source = data(&created)["createVm"]["id"].clone();
    wait_for_state(&server, &acme, &source, "running").await;
    let snapshot =
        "mutation($input: CreateSnapshotInput!) { createSnapshot(input: $input) { id } }";
    let input = json!({ "input": { "operationKey": "s-1", "vmId": source, "kind": "DISK" } });
    let taken = server.graphql(&acme, snapshot, input).await;
    let seed = data(&taken)["createSnapshot"]["id"].clone();
    eventually("the seed being ready", || async {
        let read = "query($id: ID!) { snapshot(id: $id) { state digest } }";
        let answer = server.graphql(&acme, read, json!({ "id": seed })).await;
        let ready = answer["data"]["snapshot"]["state"] == "ready";
        (ready && answer["data"]["snapshot"]["digest"].is_string()).then_some(())
    })
    .await;
    let seeded = |key: &str, task: &str| {
        let mut input = create_input(key, task);
        input["input"]["seedSnapshotId"] = seed.clone();
        input
    };

    // agent-2 has the most room (spread): it holds no copy, so its agent pulls the seed from
    // agent-1's with a grant, then boots from it.
    let created = server.graphql(&acme, CREATE, seeded("c-2", "seeded-1")).await;
    let first = data(&created)["createVm"]["id"].clone();
    let running = wait_for_state(&server, &acme, &first, "running").await;
    assert_eq!(running["data"]["vm"]["hostId"], "agent-2", "{running}");
    assert!(!artifact_local(&server, &first).await);
    assert_eq!((two.count("pull").await, one.count("artifact").await), (1, 1));
    assert_eq!(names(&agent_vms(&two).await), vec![agent_name(&first)]);

    // Now both hosts have equal room: locality breaks the tie, toward the seed's holder, and
    // nothing moves.
    let created = server.graphql(&acme, CREATE, seeded("c-3", "seeded-2")).await;
    let second = data(&created)["createVm"]["id"].clone();
    let running = wait_for_state(&server, &acme, &second, "running").await;
    assert_eq!(running["data"]["vm"]["hostId"], "agent-1", "{running}");
    assert!(artifact_local(&server, &second).await);
    assert_eq!((two.count("pull").await, one.count("artifact").await), (1, 1));

    // A seed must be one of the tenant's ready snapshots: another tenant's is answered as an
    // unknown one is.
    let theirs = server.graphql(&tenant_token("globex"), CREATE, seeded("c-4", "g-1")).await;
    assert_eq!(code(&theirs), Some("BAD_USER_INPUT"), "{theirs}");
    let mut unknown = create_input("c-5", "seeded-3");
    unknown["input"]["seedSnapshotId"] = json!("snap-0-000000");
    let unknown = server.graphql(&acme, CREATE, unknown).await;
    assert_eq!(code(&unknown), Some("BAD_USER_INPUT"), "{unknown}");
    assert_eq!(theirs["errors"][0]["message"], unknown["errors"][0]["message"]);
    // Pinned too: a pin never lets a tenant name a seed that is not its own.
    let mut pinned_theirs = seeded("c-7", "g-2");
    pinned_theirs["input"]["hostId"] = json!("agent-1");
    let pinned_theirs = server.graphql(&tenant_token("globex"), CREATE, pinned_theirs).await;
    assert_eq!(pinned_theirs["errors"][0]["message"], unknown["errors"][0]["message"]);

    // A live snapshot cannot move (its pull carries the disk half only): unpinned, refused.
    let input = json!({ "input": { "operationKey": "s-2", "vmId": source, "kind": "LIVE" } });
    let live = server.graphql(&acme, snapshot, input).await;
    let live = data(&live)["createSnapshot"]["id"].clone();
    eventually("the live snapshot being ready", || async {
        let read = "query($id: ID!) { snapshot(id: $id) { state } }";
        let answer = server.graphql(&acme, read, json!({ "id": live })).await;
        (answer["data"]["snapshot"]["state"] == "ready").then_some(())
    })
    .await;
    let mut from_live = create_input("c-6", "seeded-4");
    from_live["input"]["seedSnapshotId"] = live;
    let refused = server.graphql(&acme, CREATE, from_live).await;
    assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    let message = refused["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("hostId must be set"), "{refused}");
}
