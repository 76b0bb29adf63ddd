//! `leasehold serve` killed with SIGKILL under load, again and again, at moments drawn from
//! a seed, and started again: every mutation that was answered is in the log once, and one
//! retried with its operation key after a kill lands once; a subscription resumed from its
//! last cursor after each kill sees every event of its tenant once, in log order; after every
//! restart (the writers held still) and at the end, the read models equal a from-scratch
//! replay of the log (`events replay --compare`).
//!
//! The load holds every kind: leases; VMs (on a host an operator registered); runner leases
//! (requested, then assigned a job, which charges the tenant's runner capacity in the same
//! append); rentals (provisioned by the tenant, accepted and seen active by the provider
//! connection's agent), each with a run submitted and booked on it (a node invited in the
//! provision's append); and snapshots of VMs (the VM booted by its host's agent, the
//! snapshot asked for by the tenant and written by the agent).
//!
//! Four more kill it while one of its dispatchers sends work to a simulator of the outside
//! system (a lease backend, a rental provider, a host agent, a runner node's provider): each
//! piece of work is carried out there once, and its aggregate reaches the state it leads to.
//! One kills it while its inventory sweep closes failed leases: each is closed once.
//!
//! CI kills it 3 times in each; `LEASEHOLD_CRASH_KILLS=10` is the long run (RELIABILITY.md),
//! and `LEASEHOLD_CRASH_SEED` repeats a run's kill moments and choices of mutation.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use leasehold_domain::{Cursor, EventStore as _};
use leasehold_tests::rng::{Rng, seed_from_env};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::support::*;

/// Clients writing at once.
const WRITERS: usize = 2;

/// How long anything here may take: a restart, a retried request, the subscriber's catch-up.
const WAIT: Duration = Duration::from_secs(60);

/// The host the VMs are placed on: room for every VM a long run creates.
const HOST: &str = "crash-host";

/// The tenant's events as the subscriber received them: (stream, version).
type Received = Arc<Mutex<Vec<(String, u64)>>>;

fn kills() -> usize {
    std::env::var("LEASEHOLD_CRASH_KILLS").ok().and_then(|n| n.parse().ok()).unwrap_or(3)
}

const CREATE_VM: &str = "mutation($input: CreateVmInput!) { createVm(input: $input) { id streamId version cursor duplicate events { type } } }";
const REQUEST_RUNNER: &str = "mutation($input: RequestRunnerLeaseInput!) { requestRunnerLease(input: $input) { id streamId version cursor duplicate events { type } } }";
const ASSIGN_RUNNER: &str = "mutation($input: AssignRunnerJobInput!) { assignRunnerJob(input: $input) { id streamId version cursor duplicate events { type } } }";

/// An operator registers the host the VMs go to, its agent at `url` (wanting `token`);
/// placement sees it once it is projected.
async fn register_host(server: &Server, (url, token): (&str, Option<&str>)) {
    let operator = role_token(leasehold_gateway::Role::Operator, None);
    let input = json!({ "input": {
        "operationKey": "register", "hostId": HOST, "url": url, "token": token,
        "cpus": 100_000, "ramMb": 100_000_000, "storageGb": 1_000_000, "vmCount": 100_000,
        "labels": [],
    }});
    data(&server.graphql(&operator, crate::fleet::REGISTER, input).await);
    crate::fleet::wait_for_host(server, HOST).await;
}

const PROVISION: &str = "mutation($input: ProvisionRentalInput!) { provisionRental(input: $input) { id streamId version cursor duplicate events { type } } }";
const RECEIPT: &str = "mutation($input: RentalReceiptInput!) { reportRentalReceipt(input: $input) { id streamId version cursor duplicate events { type } } }";
const OBSERVE: &str = "mutation($input: RentalObservationInput!) { reportRentalObservation(input: $input) { id streamId version cursor duplicate events { type } } }";
const SUBMIT: &str = "mutation($input: SubmitRunInput!) { submitRun(input: $input) { id streamId version cursor duplicate events { type } } }";
const BOOT: &str = "mutation($input: VmReportInput!) { reportVmBoot(input: $input) { id streamId version cursor duplicate events { type } } }";
const SNAPSHOT: &str = "mutation($input: CreateSnapshotInput!) { createSnapshot(input: $input) { id streamId version cursor duplicate events { type } } }";
const CONFIRM: &str = "mutation($input: ConfirmSnapshotInput!) { confirmSnapshot(input: $input) { id streamId version cursor duplicate events { type } } }";

/// What the writers write.
#[derive(Clone, Copy)]
enum Mix {
    /// Every kind: a lease, a VM, a runner lease, a rental with a run, a snapshot.
    Every,
    /// Leases alone (the lease dispatcher's work).
    Leases,
    /// Rentals alone, provisioned and left to the rental dispatcher and its provider.
    Rentals,
    /// VMs alone, created and left to the VM dispatcher and their host's agent.
    Vms,
    /// Runner leases alone, assigned and left to the runner dispatcher and their node.
    Runners,
}

/// Who a writer writes as, where, and a connection of its own to read an operation id from
/// the log (what an agent learns from its work).
#[derive(Clone)]
struct Writer {
    base: String,
    tenant: String,
    provider: String,
    host_agent: String,
    log: Arc<tokio_postgres::Client>,
}

impl Writer {
    async fn send(&self, token: &str, mutation: (&str, &str), input: Value) -> Value {
        until_answered(&self.base, token, mutation, input).await
    }

    /// The operation the last `event_type` of `stream` names.
    async fn operation(&self, stream: &Value, event_type: &str) -> String {
        let stream = stream.as_str().expect("a stream");
        let row = self
            .log
            .query_one(
                "SELECT payload->>'operation' FROM events WHERE stream_id = $1 \
                 AND event_type = $2 ORDER BY position DESC LIMIT 1",
                &[&stream, &event_type],
            )
            .await;
        row.expect("the operation's event").get(0)
    }
}

/// One unit of a writer's work, of a kind of `mix` drawn from `rng`, answered: every result.
async fn one_of_each_kind(writer: &Writer, key: &str, (rng, mix): (&mut Rng, Mix)) -> Vec<Value> {
    let tenant = writer.tenant.as_str();
    let kind = match mix {
        Mix::Every => rng.below(5),
        Mix::Leases => 0,
        Mix::Rentals => 5,
        Mix::Vms => 1,
        Mix::Runners => 2,
    };
    match kind {
        0 => vec![writer.send(tenant, ("requestLease", REQUEST_LEASE), lease_request(key)).await],
        1 => vec![writer.send(tenant, ("createVm", CREATE_VM), vm_input(key)).await],
        2 => runner_lease(writer, key).await,
        3 => rental_with_a_run(writer, key).await,
        4 => snapshot_of_a_vm(writer, key).await,
        _ => vec![writer.send(tenant, ("provisionRental", PROVISION), rental_provision(key)).await],
    }
}

fn vm_input(key: &str) -> Value {
    json!({ "input": { "operationKey": key, "taskId": key, "cpus": 1, "ramMb": 256, "storageGb": 1 } })
}

/// A runner lease requested, then assigned a job.
async fn runner_lease(writer: &Writer, key: &str) -> Vec<Value> {
    let input = json!({ "input": {
        "operationKey": key, "tier": "linux-4x", "trust": "trusted", "guestOs": "linux",
        "resources": { "vcpu": 4, "memoryMb": 8192 }, "providers": ["docker"],
        "command": ["./run.sh"], "ttlSeconds": 3600,
    }});
    let requested =
        writer.send(&writer.tenant, ("requestRunnerLease", REQUEST_RUNNER), input).await;
    let assign = json!({ "input": {
        "leaseId": requested["id"], "operationKey": format!("{key}-assign"),
        "requestId": uuid::Uuid::now_v7().to_string(), "runId": 1,
    }});
    let assigned = writer.send(&writer.tenant, ("assignRunnerJob", ASSIGN_RUNNER), assign).await;
    vec![requested, assigned]
}

/// A rental provisioned, accepted and seen active by its provider's agent, and a run
/// submitted to it (booked on its schedule).
async fn rental_with_a_run(writer: &Writer, key: &str) -> Vec<Value> {
    let provision = json!({ "input": {
        "operationKey": key, "connectionId": "sim", "offerId": "gpu-1x",
        "resources": { "cpuMillis": 4000, "memoryMb": 16384, "diskGb": 100, "gpus": 1 },
        "maxLifetimeSeconds": 86400,
    }});
    let provisioned = writer.send(&writer.tenant, ("provisionRental", PROVISION), provision).await;
    let rental = &provisioned["id"];
    let receipt = json!({ "input": {
        "rentalId": rental, "generation": 1, "operationKey": format!("{key}-accept"),
        "nativeRef": format!("m-{key}"), "state": "requested", "acceptedAt": "2026-12-03T09:00:00Z",
        "duplicate": false, "interruptible": false,
        "pricing": { "currency": "USD", "microsPerHour": 900000, "exact": true },
    }});
    let accepted = writer.send(&writer.provider, ("reportRentalReceipt", RECEIPT), receipt).await;
    let look = json!({ "input": {
        "rentalId": rental, "generation": 1, "operationKey": format!("{key}-active"),
        "nativeRef": format!("m-{key}"), "state": "active", "stateSince": "2026-12-03T09:01:00Z",
        "observedAt": "2026-12-03T09:01:30Z",
    }});
    let active = writer.send(&writer.provider, ("reportRentalObservation", OBSERVE), look).await;
    let run = json!({ "input": {
        "operationKey": format!("{key}-run"), "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "ab".repeat(32)), "maxRuntimeSeconds": 600,
    }});
    let submitted = writer.send(&writer.tenant, ("submitRun", SUBMIT), run).await;
    vec![provisioned, accepted, active, submitted]
}

fn rental_provision(key: &str) -> Value {
    json!({ "input": {
        "operationKey": key, "connectionId": "sim", "offerId": "gpu-1x",
        "resources": { "cpuMillis": 4000, "memoryMb": 16384, "diskGb": 100, "gpus": 1 },
        "maxLifetimeSeconds": 86400,
    }})
}

/// A VM created and booted by its host's agent, and a snapshot of it asked for and written.
async fn snapshot_of_a_vm(writer: &Writer, key: &str) -> Vec<Value> {
    let created = writer.send(&writer.tenant, ("createVm", CREATE_VM), vm_input(key)).await;
    let boot = writer.operation(&created["streamId"], "VmScheduled").await;
    let report = json!({ "input": {
        "vmId": created["id"], "operationKey": format!("{key}-boot"), "operationId": boot,
        "url": "127.0.0.1:19551",
    }});
    let booted = writer.send(&writer.host_agent, ("reportVmBoot", BOOT), report).await;
    let ask = json!({ "input": {
        "operationKey": format!("{key}-snapshot"), "vmId": created["id"], "kind": "DISK",
    }});
    let asked = writer.send(&writer.tenant, ("createSnapshot", SNAPSHOT), ask).await;
    let written = writer.operation(&asked["streamId"], "SnapshotRequested").await;
    let confirm = json!({ "input": {
        "snapshotId": asked["id"], "operationKey": format!("{key}-written"),
        "operationId": written, "kind": "DISK", "diskBytes": 1_073_741_824_i64,
        "memoryBytes": 0, "storeRef": "snap-a",
    }});
    let confirmed = writer.send(&writer.host_agent, ("confirmSnapshot", CONFIRM), confirm).await;
    vec![created, booted, asked, confirmed]
}

/// What the writers share with the test: when to stop, how many units were answered, and a
/// gate each unit passes through (shared) that the test can hold shut (exclusive) to have
/// no unit in flight.
#[derive(Clone, Default)]
struct Load {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::RwLock<()>>,
}

/// Writes until `stop`, each unit answered before the next; the answers.
async fn write(to: Writer, (writer, seed, mix): (usize, u64, Mix), load: Load) -> Vec<Value> {
    let mut rng = Rng::new(seed.wrapping_add(writer as u64));
    let mut answered = Vec::new();
    for unit in 0.. {
        let _passing = load.gate.read().await;
        if load.stop.load(Ordering::Relaxed) {
            break;
        }
        let key = format!("w{writer}-{unit}");
        answered.extend(one_of_each_kind(&to, &key, (&mut rng, mix)).await);
        load.count.fetch_add(1, Ordering::Relaxed);
    }
    answered
}
/// Follows `lifecycleEvents` from `after` until `stop`, reconnecting after every kill and
/// resuming from the last cursor it received.
async fn subscribe(
    base: String,
    token: String,
    mut after: Value,
    received: Received,
    stop: Arc<AtomicBool>,
) {
    let url = format!("{}/graphql/ws", base.replace("http://", "ws://"));
    while !stop.load(Ordering::Relaxed) {
        let mut request = url.clone().into_client_request().expect("a URL");
        request
            .headers_mut()
            .insert("sec-websocket-protocol", "graphql-transport-ws".parse().expect("a header"));
        let Ok((mut socket, _)) = tokio_tungstenite::connect_async(request).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let init = json!({ "type": "connection_init", "payload": { "authorization": format!("Bearer {token}") } });
        let query = "subscription($after: String) { lifecycleEvents(after: $after) { cursor streamId version } }";
        let subscribe = json!({ "type": "subscribe", "id": "1", "payload": { "query": query, "variables": { "after": after } } });
        if socket.send(Message::Text(init.to_string().into())).await.is_err()
            || socket.send(Message::Text(subscribe.to_string().into())).await.is_err()
        {
            continue;
        }
        while let Some(Ok(frame)) = socket.next().await {
            let Message::Text(text) = frame else { continue };
            let message: Value = serde_json::from_str(&text).expect("JSON");
            if message["type"] == "next" {
                let event = &message["payload"]["data"]["lifecycleEvents"];
                let stream = event["streamId"].as_str().expect("a stream").to_owned();
                let version = event["version"].as_u64().expect("a version");
                received.lock().expect("not poisoned").push((stream, version));
                after = event["cursor"].clone();
            }
        }
    }
}

/// [`WRITERS`] writers of `mix`, as tenant `token`.
async fn writers(
    (server, token): (&Server, &str),
    (seed, mix): (u64, Mix),
    load: &Load,
) -> Vec<tokio::task::JoinHandle<Vec<Value>>> {
    let to = Writer {
        base: server.base.clone(),
        tenant: token.to_owned(),
        provider: crate::rented::provider_agent("sim"),
        host_agent: crate::fleet::host_agent(HOST),
        log: Arc::new(server.db.client().await),
    };
    let writer = |n| tokio::spawn(write(to.clone(), (n, seed, mix), load.clone()));
    (0..WRITERS).map(writer).collect()
}

/// Kills the server [`kills`] times, each at a moment drawn from `seed` once the writers have
/// made some progress since the last start (a kill during start-up alone would test only
/// start-up), and starts it again; with `compare_each`, the read models are compared with a
/// replay of the log after every start, the writers held still meanwhile.
async fn kill_again_and_again(server: &mut Server, seed: u64, load: &Load, compare_each: bool) {
    let count = &load.count;
    let mut rng = Rng::new(seed);
    for _ in 0..kills() {
        let progress = count.load(Ordering::Relaxed) + 1;
        let moment = Duration::from_millis(rng.below(400) as u64);
        let answered = tokio::time::timeout(WAIT, async {
            while count.load(Ordering::Relaxed) < progress {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(moment).await;
        });
        answered.await.expect("the writers are answered");
        server.child.start_kill().expect("SIGKILL sent");
        server.child.wait().await.expect("it died");
        server.start_again().await;
        if compare_each {
            let _held = load.gate.write().await;
            replay_equals_read_models(server).await;
        }
    }
}

/// [`WRITERS`] writers of `mix` as tenant `token`, while the server is killed [`kills`] times
/// and started again (no comparison between starts: a dispatcher's simulator and the sweeps
/// append while the writers are held); every answer.
async fn written_under_kills(
    server: &mut Server,
    token: &str,
    (seed, mix): (u64, Mix),
) -> Vec<Value> {
    let load = Load::default();
    let writers = writers((server, token), (seed, mix), &load).await;
    kill_again_and_again(server, seed, &load, false).await;
    load.stop.store(true, Ordering::Relaxed);
    let mut answered = Vec::new();
    for writer in writers {
        answered.extend(writer.await.expect("a writer ran"));
    }
    answered
}

/// The dispatcher, a reconciler, killed with its server at moments drawn from the seed while
/// leases are requested: after the last start every lease becomes ready, provisioned once
/// (each of its dispatch attempts recorded under a number of its own), and the backend (`leasehold
/// backend-sim`, a process of its own that lives on) took each lease's provision once. A
/// provision sent again after a kill is answered 409 `already_provisioned`, as fred's backends
/// answer it; the dispatcher must take that as done, not as a failure or a second lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_at_any_moment_has_the_backend_act_once_per_lease() {
    use crate::backend::{Sim, backends_file, count as count_of, scratch, stream_events};
    let seed = seed_from_env("LEASEHOLD_CRASH_SEED");
    eprintln!("crash: seed {seed} (LEASEHOLD_CRASH_SEED repeats the kill moments)");
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let file = backends_file(&dir.0, &sim.url);
    let file = file.to_str().expect("a UTF-8 path");
    // The inventory sweep settles a lease whose backend's callback found the server down.
    let args = ["--backend", "sim-1", "--backends-file", file, "--inventory-every", "1s"];
    let mut server = Server::start_with(&args).await;
    let acme = tenant_token("acme");
    let leases = written_under_kills(&mut server, &acme, (seed, Mix::Leases)).await;
    let observer = server.db.client().await;
    let mut sent_again = 0;
    for lease in &leases {
        crate::backend::wait_for_status(&server, &acme, &lease["id"], "READY").await;
        let events = stream_events(&server, &lease["id"]).await;
        assert_eq!(count_of(&events, "LeaseProvisioned"), 1, "{events:?}");
        // Each send is recorded under its own attempt number. A kill between a send's record
        // and its outbox's settlement leaves the work to the next instance, which sends it
        // again at once: the backend answers `409 already provisioned`, recorded as taken
        // under the next number. Never one number twice.
        let attempts = "SELECT payload->>'attempt' FROM events WHERE stream_id = $1 \
                        AND event_type = 'LeaseDispatched'";
        let stream = lease["streamId"].as_str().expect("a stream");
        let rows = observer.query(attempts, &[&stream]).await.expect("read");
        let numbers: std::collections::BTreeSet<String> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(numbers.len(), rows.len(), "{stream}: an attempt number twice: {events:?}");
        sent_again += rows.len().saturating_sub(1);
    }
    let (sent, acted) = (sim.received("provision").await, sim.received("provision-accepted").await);
    assert_eq!(acted, leases.len() as u64, "the backend took each lease's provision once");
    assert!(sent >= acted, "{sent} sent");
    eprintln!(
        "crash: {} kills; {} leases, provisions sent {sent} ({sent_again} recorded taken \
         again), acted on {acted}",
        kills(),
        leases.len()
    );
}

/// The rental dispatcher and observer, reconcilers, killed with their server at moments drawn
/// from the seed while rentals are provisioned through `leasehold backend-sim --provider` (a
/// process of its own that lives on): every rental becomes active, accepted once, and the
/// provider made one machine for each. A provision whose answer a kill lost is found again
/// in the provider's listing, never made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rental_dispatcher_killed_at_any_moment_has_the_provider_make_one_machine_each() {
    use crate::providers::{EVERY, ProviderSim, rental_in, server_renting_from, temp_dir};
    let seed = seed_from_env("LEASEHOLD_CRASH_SEED");
    eprintln!("crash: seed {seed} (LEASEHOLD_CRASH_SEED repeats the kill moments)");
    let dir = temp_dir();
    let provider = ProviderSim::start(&dir.0, EVERY, &[]).await;
    let mut server = server_renting_from(&provider, &dir.0, EVERY).await;
    let acme = tenant_token("acme");
    let rentals = written_under_kills(&mut server, &acme, (seed, Mix::Rentals)).await;
    let observer = server.db.client().await;
    for rental in &rentals {
        rental_in(&server, &acme, &rental["id"], "active").await;
        let accepted = "SELECT count(*) FROM events WHERE stream_id = $1 \
                        AND event_type = 'CapacityAccepted'";
        let stream = rental["streamId"].as_str().expect("a stream");
        let row = observer.query_one(accepted, &[&stream]).await.expect("counted");
        assert_eq!(row.get::<_, i64>(0), 1, "{stream} accepted once");
    }
    let machines = provider.machines().await.len();
    let sent = provider.count("provision").await;
    assert_eq!(machines, rentals.len(), "one machine per rental");
    assert!(sent >= machines as u64, "{sent} provisions received");
    eprintln!(
        "crash: {} kills; {} rentals, provisions received {sent}, machines {machines}",
        kills(),
        rentals.len()
    );
}

/// The VM dispatcher, a reconciler, killed with its server at moments drawn from the seed
/// while VMs are created and it boots each on its host's agent (`leasehold backend-sim
/// --host-agent`, a process of its own that lives on): every VM reads running, its stream
/// holding one `VmRunning`, and the agent booted one VM for each. A boot sent again after a
/// kill is answered 409 (that VM is there), which the dispatcher must take as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_dispatcher_killed_at_any_moment_has_the_host_agent_boot_each_vm_once() {
    use crate::fleet::{AGENT_TOKEN, agent_vms, start_agent};
    let seed = seed_from_env("LEASEHOLD_CRASH_SEED");
    eprintln!("crash: seed {seed} (LEASEHOLD_CRASH_SEED repeats the kill moments)");
    let agent = start_agent(&[]).await;
    let mut server = Server::start().await;
    register_host(&server, (&agent.url, Some(AGENT_TOKEN))).await;
    let acme = tenant_token("acme");
    let vms = written_under_kills(&mut server, &acme, (seed, Mix::Vms)).await;
    let observer = server.db.client().await;
    for vm in &vms {
        let stream = vm["streamId"].as_str().expect("a stream");
        let running = tokio::time::timeout(WAIT, async {
            loop {
                let read = server.graphql(&acme, crate::fleet::VM, json!({ "id": vm["id"] })).await;
                if read["data"]["vm"]["state"] == "running" {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        if running.await.is_err() {
            let name = format!("lh-{}", vm["id"].as_str().expect("an id"));
            let held = agent_vms(&agent).await.to_string().contains(&name);
            let types = event_types(&observer, stream).await;
            panic!("{stream} not running in {WAIT:?} (the agent holds it: {held}): {types:?}");
        }
        let running = "SELECT count(*) FROM events WHERE stream_id = $1 \
                       AND event_type = 'VmRunning'";
        let row = observer.query_one(running, &[&stream]).await.expect("counted");
        assert_eq!(row.get::<_, i64>(0), 1, "{stream} running once");
    }
    let booted = agent_vms(&agent).await["vms"].as_array().map_or(0, Vec::len);
    let sent = agent.count("create").await;
    assert_eq!(booted, vms.len(), "the agent booted one VM per VM");
    assert!(sent >= booted as u64, "{sent} boots received");
    eprintln!(
        "crash: {} kills; {} VMs, boots received {sent}, booted {booted}",
        kills(),
        vms.len()
    );
}

/// The runner dispatcher killed with its server at moments drawn from the seed while runner
/// leases are assigned and it launches each one's instance on its node's provider
/// (`leasehold backend-sim --runner-provider`, a process of its own that lives on): every
/// lease reads launched, with its instance, and the provider launched one instance for each,
/// once. A launch whose answer a kill lost is found by name before anything is launched
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_dispatcher_killed_at_any_moment_has_the_node_launch_each_instance_once() {
    use crate::runner_dispatch::{REGISTER, dispatching, node_agent, operator_reads};
    let seed = seed_from_env("LEASEHOLD_CRASH_SEED");
    eprintln!("crash: seed {seed} (LEASEHOLD_CRASH_SEED repeats the kill moments)");
    let (mut server, sim, _dir) = dispatching(&[]).await;
    // The node registers again with room for every lease a long run assigns.
    let roomy = json!({ "input": {
        "operationKey": "reg-roomy", "provider": "docker", "guestOs": ["linux"],
        "accepts": ["trusted", "untrusted"], "vcpu": 1_000_000, "memoryMb": 1_000_000_000_i64,
        "inventory": [] } });
    data(&server.graphql(&node_agent(), REGISTER, roomy).await);
    let acme = tenant_token("acme");
    let written = written_under_kills(&mut server, &acme, (seed, Mix::Runners)).await;
    let ids = written.iter().map(|answered| answered["id"].as_str().expect("an id").to_owned());
    let leases: std::collections::BTreeSet<String> = ids.collect();
    for lease in &leases {
        let launched = |read: &Value| !read["instanceId"].is_null();
        operator_reads(&server, &json!(lease), "launched", launched).await;
    }
    let instances = sim.get("/sim/instances").await;
    let instances = instances.as_array().cloned().unwrap_or_default();
    assert_eq!(instances.len(), leases.len(), "one instance per lease");
    for instance in &instances {
        assert_eq!(instance["launches"], 1, "launched once: {instance}");
    }
    let requests = sim.get("/sim/requests").await;
    eprintln!(
        "crash: {} kills; {} runner leases, provider requests {requests}",
        kills(),
        leases.len()
    );
}

/// The inventory sweep, a reconciler, killed with its server at moments drawn from the seed
/// while it closes failed leases: leases made ready through `leasehold backend-sim` (which
/// lists an exhausted retry budget for a failed lease) fail a few before each kill, and the
/// sweep, every second, closes each and has it deprovisioned. After the last start every lease reads
/// deprovisioned, its stream holding one `LeaseClosedForFailure` and one `LeaseDeprovisioned`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inventory_sweep_killed_at_any_moment_closes_each_failed_lease_once() {
    use crate::backend::{Sim, backends_file, count as count_of, ready_lease, scratch};
    use crate::backend::{stream_events, wait_for_status};
    let seed = seed_from_env("LEASEHOLD_CRASH_SEED");
    eprintln!("crash: seed {seed} (LEASEHOLD_CRASH_SEED repeats the kill moments)");
    let dir = scratch();
    let sim = Sim::start_with("127.0.0.1:0", &dir.0, &["exhausted-budget"]).await;
    let file = backends_file(&dir.0, &sim.url);
    let file = file.to_str().expect("a UTF-8 path");
    let args = ["--backend", "sim-1", "--backends-file", file, "--inventory-every", "1s"];
    let mut server = Server::start_with(&args).await;
    let acme = tenant_token("acme");
    let mut leases = Vec::new();
    for n in 0..LEASES_FAILED_A_KILL * kills() {
        leases.push(ready_lease(&server, &acme, &format!("lease-{n}")).await);
    }
    let (http, mut rng) = (reqwest::Client::new(), Rng::new(seed));
    let observer = server.db.client().await;
    let closed = "SELECT count(*) FROM events WHERE event_type = 'LeaseClosedForFailure'";
    let mut closed_at_kills = Vec::new();
    for wave in leases.chunks(LEASES_FAILED_A_KILL) {
        for lease in wave {
            let url = format!("{}/sim/fail/{}", sim.url, lease.as_str().expect("an id"));
            let answer = http.post(url).send().await.expect("the sim answers");
            assert_eq!(answer.status().as_u16(), 202);
        }
        // A moment around the sweep's work on this wave: a sweep runs every second.
        tokio::time::sleep(Duration::from_millis(rng.below(1_500) as u64)).await;
        let row = observer.query_one(closed, &[]).await.expect("counted");
        closed_at_kills.push(row.get::<_, i64>(0));
        server.child.start_kill().expect("SIGKILL sent");
        server.child.wait().await.expect("it died");
        server.start_again().await;
    }
    for lease in &leases {
        wait_for_status(&server, &acme, lease, "DEPROVISIONED").await;
        let events = stream_events(&server, lease).await;
        assert_eq!(count_of(&events, "LeaseClosedForFailure"), 1, "{events:?}");
        assert_eq!(count_of(&events, "LeaseDeprovisioned"), 1, "{events:?}");
    }
    let deprovisions = sim.received("deprovision").await;
    assert!(deprovisions >= leases.len() as u64, "{deprovisions} deprovisions sent");
    eprintln!(
        "crash: {} kills (leases closed before each: {closed_at_kills:?}); {} failed leases \
         closed once each, deprovisions sent {deprovisions}",
        kills(),
        leases.len()
    );
}

/// Leases the sweep's test fails before each kill.
const LEASES_FAILED_A_KILL: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_under_load_loses_nothing_repeats_nothing_and_resumes_its_feeds() {
    let seed = seed_from_env("LEASEHOLD_CRASH_SEED");
    eprintln!("crash: seed {seed} (LEASEHOLD_CRASH_SEED repeats the kill moments)");
    let (mut server, _providers) = crate::rented::rented_server().await;
    register_host(&server, ("http://127.0.0.1:9", None)).await;
    let acme = tenant_token("acme");
    let start = request_lease(&server, &acme, "start").await;
    let (load, unsubscribe) = (Load::default(), Arc::new(AtomicBool::new(false)));
    let received = Received::default();
    let subscriber = tokio::spawn(subscribe(
        server.base.clone(),
        acme.clone(),
        start["cursor"].clone(),
        received.clone(),
        unsubscribe.clone(),
    ));
    let writers = writers((&server, &acme), (seed, Mix::Every), &load).await;
    kill_again_and_again(&mut server, seed, &load, true).await;
    load.stop.store(true, Ordering::Relaxed);
    let mut results = vec![start.clone()];
    for writer in writers {
        results.extend(writer.await.expect("a writer ran"));
    }

    // Each answered mutation's events are in its stream once, and nothing no answer names
    // was created (a retry after a kill landed once, or found its first landing).
    let observer = server.db.client().await;
    for result in &results {
        let stream = result["streamId"].as_str().expect("a stream");
        for event in result["events"].as_array().expect("events") {
            let kind = event["type"].as_str().expect("a type");
            let count = "SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = $2";
            let row = observer.query_one(count, &[&stream, &kind]).await.expect("counted");
            assert_eq!(row.get::<_, i64>(0), 1, "{kind} of {stream}");
        }
    }
    for (first, prefix) in FIRST_EVENTS {
        let count = "SELECT count(DISTINCT stream_id) FROM events WHERE event_type = $1";
        let logged: i64 = observer.query_one(count, &[&first]).await.expect("counted").get(0);
        let answered = results
            .iter()
            .filter(|r| r["streamId"].as_str().is_some_and(|s| s.starts_with(prefix)))
            .map(|r| &r["streamId"])
            .collect::<std::collections::HashSet<_>>();
        assert_eq!(logged as usize, answered.len(), "{first}: a stream no answer names");
    }
    let kinds = FIRST_EVENTS.map(|(_, prefix)| {
        let of_kind = |r: &&Value| r["streamId"].as_str().is_some_and(|s| s.starts_with(prefix));
        (prefix, results.iter().filter(of_kind).count())
    });
    eprintln!("crash: {} kills; mutations answered by stream kind {kinds:?}", kills());
    let leases = results;
    // The subscription saw each of its tenant's events after its start once, in log order.
    let store = server.db.store();
    let from: String = leasehold_gateway::cursor::CursorKey::derive(SECRET.as_bytes())
        .open(
            leasehold_gateway::cursor::CursorKind::Log,
            "tenant:acme",
            "after",
            leases[0]["cursor"].as_str().expect("a cursor"),
        )
        .expect("the start cursor opens");
    let head = server.db.settled_head().await;
    let mut expected = Vec::new();
    let mut after: Cursor = from.parse().expect("a cursor");
    while after < head {
        let page = store.read_log(after, 1_000).await.expect("the log");
        expected.extend(
            page.events
                .iter()
                .filter(|e| e.tenant_id.as_str() == "acme")
                .map(|e| (e.stream_id.as_str().to_owned(), e.version)),
        );
        after = page.next;
    }
    let caught_up = tokio::time::timeout(WAIT, async {
        while received.lock().expect("not poisoned").len() < expected.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    if caught_up.await.is_err() {
        let received = received.lock().expect("not poisoned").len();
        panic!("the subscriber received {received} of {} events in time", expected.len());
    }
    unsubscribe.store(true, Ordering::Relaxed);
    subscriber.abort();
    assert_eq!(*received.lock().expect("not poisoned"), expected);

    // The read models equal a replay of the whole log, once the projections have caught up.
    replay_equals_read_models(&server).await;
}

/// The event types of `stream`, in order.
async fn event_types(observer: &tokio_postgres::Client, stream: &str) -> Vec<String> {
    let types = "SELECT event_type FROM events WHERE stream_id = $1 ORDER BY version";
    let rows = observer.query(types, &[&stream]).await.expect("read");
    rows.iter().map(|row| row.get(0)).collect()
}

/// Each kind's first event, and its streams' prefix: every stream that holds one must be
/// named by an answer.
const FIRST_EVENTS: [(&str, &str); 6] = [
    ("LeaseProvisionRequested", "lease-"),
    ("VmProvisioning", "vm-"),
    ("RunnerLeaseRequested", "runner-lease-"),
    ("CapacityRequested", "rental-"),
    ("RunRequested", "run-"),
    ("SnapshotRequested", "snapshot-"),
];

/// Exports the log and replays it against the live read models until they agree (the
/// projections may still be catching up after the last restart), at most [`WAIT`].
async fn replay_equals_read_models(server: &Server) {
    let url = server.database_url();
    let file = std::env::temp_dir().join(format!("lh-crash-{}.ndjson", uuid::Uuid::now_v7()));
    let path = file.to_str().expect("a path").to_owned();
    let agreed = tokio::time::timeout(WAIT, async {
        loop {
            let export = cli(&["events", "export", "--database-url", &url, "-o", &path]).await;
            assert!(export.status.success(), "{export:?}");
            let replay = cli(&["events", "replay", "--from", &path, "--compare", &url]).await;
            let out = String::from_utf8_lossy(&replay.stdout).into_owned();
            if replay.status.success() {
                return;
            }
            // A projection behind the file is waited for, and one past it (an append the
            // export did not see yet) is exported again; a row that differs between the file
            // and a projection at its very end is a failure.
            let uneven = out.contains("has not reached") || out.contains("past the file's last");
            assert!(!out.contains("DIFFERS") || uneven, "{out}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let result = agreed.await;
    let _ = std::fs::remove_file(&file);
    result.expect("the read models equal a replay of the log");
}

async fn cli(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env("LEASEHOLD_LOG", "warn")
        .output()
        .await
        .expect("the leasehold binary runs")
}
