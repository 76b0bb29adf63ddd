//! Dispatch end to end: `leasehold serve` with a backends file sends each lease's work to
//! `leasehold backend-sim` (a separate process speaking the backends' protocol), the sim calls
//! back on the operation's URL, and the lease becomes ready, read back by its tenant.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::backend::*;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_lease_is_dispatched_called_back_and_ready() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let tenant = tenant_token("acme");
    let lease = request_lease(&server, &tenant, "req-1").await;
    wait_for_status(&server, &tenant, &lease["id"], "READY").await;
    let events = stream_events(&server, &lease["id"]).await;
    assert_eq!(events[0], "LeaseProvisionRequested", "{events:?}");
    for event_type in ["LeaseDispatched", "LeaseProvisioned", "LeaseActivated"] {
        assert_eq!(count(&events, event_type), 1, "{events:?}");
    }
    assert_eq!(sim.received("provision").await, 1);
    // Its callbacks are verified with its backend's secret: the callback secret (another
    // backend's, say) does not verify one on this lease.
    let path =
        lease_work(&server, &lease["id"]).await["callbackPath"].as_str().unwrap().to_string();
    let body =
        json!({ "lease_uuid": lease["id"], "status": "failed", "error": "forged" }).to_string();
    let secret =
        leasehold_gateway::callbacks::CallbackSecret::new(CALLBACK_SECRET.as_bytes()).unwrap();
    let signature = secret.sign(chrono::Utc::now().timestamp(), "POST", &path, body.as_bytes());
    let forged = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .header(leasehold_gateway::callbacks::SIGNATURE_HEADER, signature)
        .body(body)
        .send()
        .await
        .expect("answers");
    assert_eq!(forged.status().as_u16(), 401);

    // Releasing it: the backend's `200` is the release; the dispatcher reads it back (gone,
    // not retained) and confirms it.
    release(&server, &tenant, &lease["id"], "release-1").await;
    wait_for_status(&server, &tenant, &lease["id"], "DEPROVISIONED").await;
    assert_eq!(sim.received("deprovision").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_waits_while_the_backend_is_down_and_completes_once_when_it_is_back() {
    let dir = scratch();
    // A free port nothing listens on yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bound").local_addr().unwrap();
    let url = format!("http://{port}");
    let server = serve_dispatching(&backends_file(&dir.0, &url)).await;
    let tenant = tenant_token("acme");
    let mut leases = Vec::new();
    for key in ["down-1", "down-2", "down-3"] {
        leases.push(request_lease(&server, &tenant, key).await["id"].clone());
    }
    // Attempts fail and are recorded; the leases wait, provisioning.
    let failed = "SELECT count(*) FROM events WHERE event_type = 'LeaseDispatchFailed'";
    eventually("three failed attempts recorded", || async {
        let client = server.db.client().await;
        let row = client.query_one(failed, &[]).await.expect("counted");
        (row.get::<_, i64>(0) >= 3).then_some(())
    })
    .await;
    let sim = Sim::start(&port.to_string(), &dir.0).await;
    for lease in &leases {
        wait_for_status(&server, &tenant, lease, "READY").await;
    }
    for lease in &leases {
        let events = stream_events(&server, lease).await;
        assert_eq!(count(&events, "LeaseProvisioned"), 1, "{events:?}");
        assert_eq!(count(&events, "LeaseDispatched"), 1, "{events:?}");
    }
    assert_eq!(sim.received("provision").await, 3);
    drop(sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_recorded_before_a_crash_is_sent_after_the_restart() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let file = backends_file(&dir.0, &sim.url);
    // Recorded by a server that dispatches nothing, which is then killed outright.
    let mut server = Server::start_with(&["--backend", "sim-1"]).await;
    let tenant = tenant_token("acme");
    let lease = request_lease(&server, &tenant, "crash-1").await["id"].clone();
    server.child.start_kill().expect("killed");
    let _ = server.child.wait().await;
    assert_eq!(sim.received("provision").await, 0);
    // The same database, now dispatching.
    server.restart_with(&["--backend", "sim-1", "--backends-file", file.to_str().unwrap()]).await;
    wait_for_status(&server, &tenant, &lease, "READY").await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseProvisioned"), 1, "{events:?}");
    assert!(sim.received("provision").await >= 1);
}

const RESTART: &str =
    "mutation($input: LeaseOperationInput!) { restartLease(input: $input) { id } }";

/// A restart is sent with its maintenance id and admission stamp; the backend's completion
/// settles it: echoing both, echoing neither (an older backend: by the id alone), or
/// reporting the restart failed and rolled back (the lease stays ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatched_restart_settles_with_the_completion_the_backend_sends() {
    let cases = [
        (&[][..], "LeaseMaintenanceSucceeded", None),
        (&["omit-stamp"][..], "LeaseMaintenanceSucceeded", None),
        (&["rollback"][..], "LeaseMaintenanceRecovered", Some("RestartFailed")),
    ];
    for (faults, settled, reason) in cases {
        let dir = scratch();
        let sim = Sim::start_with("127.0.0.1:0", &dir.0, faults).await;
        let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
        let tenant = tenant_token("acme");
        let lease = ready_lease(&server, &tenant, "req-1").await;
        let input = json!({ "input": { "leaseId": lease, "operationKey": "restart-1" } });
        data(&server.graphql(&tenant, RESTART, input).await);
        wait_for_events(&server, &lease, settled, 1).await;
        // The dispatcher records the restart as dispatched once its send returns; the
        // backend's completion may be recorded first, so wait for both (bounded).
        let events = wait_for_events(&server, &lease, "LeaseDispatched", 2).await;
        assert_eq!(count(&events, settled), 1, "{faults:?}: {events:?}");
        assert_eq!(count(&events, "LeaseRestartStarted"), 1, "{faults:?}: {events:?}");
        assert_eq!(count(&events, "LeaseDispatched"), 2, "{faults:?}: {events:?}");
        assert_eq!(sim.received("restart").await, 1, "{faults:?}");
        wait_for_status(&server, &tenant, &lease, "READY").await;
        let read = "query($id: ID!) { lease(id: $id) { reason } }";
        let shown = server.graphql(&tenant, read, json!({ "id": lease })).await;
        assert_eq!(data(&shown)["lease"]["reason"].as_str(), reason, "{faults:?}");
    }
}

/// A backend's typed refusal fails the lease with the backend's reason and its own words (the
/// tenant may read them); a garbage error body is never read as a refusal: the work is tried
/// again and the lease waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_fail_the_lease_and_garbage_never_does() {
    let dir = scratch();
    let sim = Sim::start_with("127.0.0.1:0", &dir.0, &["refuse-validation"]).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let tenant = tenant_token("acme");
    let lease = request_lease(&server, &tenant, "req-1").await["id"].clone();
    wait_for_status(&server, &tenant, &lease, "FAILED").await;
    let read = "query($id: ID!) { lease(id: $id) { status chainState reason message } }";
    let shown = server.graphql(&tenant, read, json!({ "id": lease })).await;
    let shown = &data(&shown)["lease"];
    assert_eq!(
        (&shown["chainState"], &shown["reason"], &shown["message"]),
        (&json!("REJECTED"), &json!("UnknownSku"), &json!("sku is not offered here"))
    );

    let dir = scratch();
    let sim = Sim::start_with("127.0.0.1:0", &dir.0, &["garbage"]).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let lease = request_lease(&server, &tenant, "req-1").await["id"].clone();
    let events = wait_for_events(&server, &lease, "LeaseDispatchFailed", 2).await;
    assert_eq!(count(&events, "LeaseProvisionFailed"), 0, "{events:?}");
    let shown = server.graphql(&tenant, read, json!({ "id": lease })).await;
    assert_eq!(data(&shown)["lease"]["status"], "PROVISIONING");
    let client = server.db.client().await;
    let row = client
        .query_one("SELECT last_error FROM dispatch_outbox WHERE state = 'pending'", &[])
        .await
        .expect("its outbox row");
    let last_error: String = row.get(0);
    assert!(!last_error.contains("/var/lib"), "the body is not quoted: {last_error}");
    let (_, metrics) = server.get("/metrics").await;
    let counted = metrics
        .lines()
        .find(|line| {
            line.starts_with("leasehold_backend_malformed_error_bodies_total{backend=\"sim-1\"}")
        })
        .and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(counted.is_some_and(|n| n >= 2), "{metrics}");
}

/// A backends file of several backends: `(name, url, extra settings)`.
fn routed_backends_file(dir: &Path, name: &str, backends: &[(&str, &str, Value)]) -> PathBuf {
    let entries: Vec<Value> = backends
        .iter()
        .map(|(backend, url, extra)| {
            let mut entry = json!({ "name": backend, "url": url, "secret_file": "sim.secret" });
            for (key, value) in extra.as_object().expect("an object") {
                entry[key] = value.clone();
            }
            entry
        })
        .collect();
    let file = dir.join(name);
    std::fs::write(dir.join("sim.secret"), SIM_SECRET).expect("written");
    std::fs::write(&file, json!({ "backends": entries }).to_string()).expect("written");
    file
}

/// Requests a lease of one `sku`.
async fn request_sku(server: &Server, tenant: &str, key: &str, sku: &str) -> Value {
    let mut input = lease_request(key);
    input["input"]["items"] = json!([{ "sku": sku, "quantity": 1 }]);
    data(&server.graphql(tenant, REQUEST_LEASE, input).await)["requestLease"]["id"].clone()
}

/// Fred's routing: the backends listing the SKU are the candidates, the least loaded by its
/// stats wins; a SKU nobody lists goes to the default; a fenced backend is never chosen,
/// never asked for its stats, never sent work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_picks_the_least_loaded_matching_backend_and_never_a_fenced_one() {
    let dir = scratch();
    let busy = Sim::start_args("127.0.0.1:0", &dir.0, &["--allocated-cpu-cores", "48"]).await;
    let idle = Sim::start_args("127.0.0.1:0", &dir.0, &["--allocated-cpu-cores", "8"]).await;
    let other = Sim::start("127.0.0.1:0", &dir.0).await;
    let gpu = json!({ "skus": ["gpu.h100.1x"] });
    let file = routed_backends_file(
        &dir.0,
        "open.json",
        &[
            ("busy", &busy.url, gpu.clone()),
            ("idle", &idle.url, gpu.clone()),
            ("other", &other.url, json!({ "default": true })),
        ],
    );
    // Health probes ask for stats too: once at start, then not for a day.
    let started = chrono::Utc::now();
    let probing = ["--health-every", "1d"];
    let mut server =
        Server::start_with(&[&["--backends-file", file.to_str().unwrap()][..], &probing].concat())
            .await;
    probed_since(&server, started, 3).await;
    let probed = [busy.received("stats").await, idle.received("stats").await];
    let other_probed = other.received("stats").await;
    let tenant = tenant_token("acme");
    let lease = request_sku(&server, &tenant, "gpu-1", "gpu.h100.1x").await;
    wait_for_status(&server, &tenant, &lease, "READY").await;
    assert_eq!((busy.received("provision").await, idle.received("provision").await), (0, 1));
    let routed = [busy.received("stats").await, idle.received("stats").await];
    assert_eq!((routed[0] - probed[0], routed[1] - probed[1]), (1, 1), "each candidate asked");
    let lease = request_sku(&server, &tenant, "cpu-1", "cpu.small.1x").await;
    wait_for_status(&server, &tenant, &lease, "READY").await;
    assert_eq!(other.received("provision").await, 1, "a SKU nobody lists goes to the default");
    assert_eq!(other.received("stats").await, other_probed, "one candidate: no stats asked");

    // The idle backend fenced: the busy one takes the work, and the fenced one hears nothing.
    server.terminate().await;
    let fenced = json!({ "skus": ["gpu.h100.1x"], "fenced": true });
    let file = routed_backends_file(
        &dir.0,
        "fenced.json",
        &[
            ("busy", &busy.url, gpu),
            ("idle", &idle.url, fenced),
            ("other", &other.url, json!({ "default": true })),
        ],
    );
    let restarted = chrono::Utc::now();
    server
        .restart_with(&[&["--backends-file", file.to_str().unwrap()][..], &probing].concat())
        .await;
    probed_since(&server, restarted, 3).await;
    let lease = request_sku(&server, &tenant, "gpu-2", "gpu.h100.1x").await;
    wait_for_status(&server, &tenant, &lease, "READY").await;
    assert_eq!((busy.received("provision").await, idle.received("provision").await), (1, 1));
    assert_eq!(idle.received("stats").await, routed[1], "a fenced backend is not asked");
    let (_, metrics) = server.get("/metrics").await;
    assert!(metrics.contains("leasehold_backend_fenced{backend=\"idle\"} 1"), "{metrics}");
    assert!(metrics.contains("leasehold_backend_fenced{backend=\"busy\"} 0"), "{metrics}");
    assert!(metrics.contains("leasehold_backend_circuit_state{backend=\"busy\"} 0"), "{metrics}");
}

/// Waits until `n` backends have been probed since `since` (a fenced one is recorded without
/// being called).
async fn probed_since(server: &Server, since: chrono::DateTime<chrono::Utc>, n: usize) {
    let operator = role_token(leasehold_gateway::Role::Operator, None);
    eventually("the first health probes", || async {
        let answer = server.graphql(&operator, "{ backends { probedAt } }", json!({})).await;
        let rows = data(&answer)["backends"].as_array().cloned().unwrap_or_default();
        let fresh = rows.iter().filter(|row| {
            row["probedAt"]
                .as_str()
                .and_then(|at| at.parse::<chrono::DateTime<chrono::Utc>>().ok())
                .is_some_and(|at| at >= since)
        });
        (fresh.count() >= n).then_some(())
    })
    .await;
}

/// Without stats from any candidate, leases go to the candidates in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_stats_routing_takes_the_candidates_in_turn() {
    let dir = scratch();
    let first = Sim::start_with("127.0.0.1:0", &dir.0, &["no-stats"]).await;
    let second = Sim::start_with("127.0.0.1:0", &dir.0, &["no-stats"]).await;
    let gpu = json!({ "skus": ["gpu.h100.1x"] });
    let file = routed_backends_file(
        &dir.0,
        "backends.json",
        &[("first", &first.url, gpu.clone()), ("second", &second.url, gpu)],
    );
    let server = Server::start_with(&["--backends-file", file.to_str().unwrap()]).await;
    let tenant = tenant_token("acme");
    for key in ["turn-1", "turn-2"] {
        let lease = request_sku(&server, &tenant, key, "gpu.h100.1x").await;
        wait_for_status(&server, &tenant, &lease, "READY").await;
    }
    assert_eq!((first.received("provision").await, second.received("provision").await), (1, 1));
    let (_, metrics) = server.get("/metrics").await;
    assert!(metrics.contains("leasehold_routing_fallbacks_total 2"), "{metrics}");
}

/// Review fix: a later attempt's `409 invalid state` is taken as the earlier attempt having
/// landed only when the backend's own record shows the work under way. Here the first restart
/// attempt finds the backend down; the backend comes back holding the lease in another state
/// (still provisioning it), so the second attempt's 409 is a refusal: the restart fails and
/// the lease is not left restarting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_conflict_is_read_against_the_backends_record() {
    use leasehold_adapters::backends::wire::{LeaseItem, ProvisionRequest};
    use leasehold_adapters::backends::{BackendClient, BackendConfig, SigningSecret};
    let dir = scratch();
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bound").local_addr().unwrap();
    let sim = Sim::start(&port.to_string(), &dir.0).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    drop(sim);
    let input = json!({ "input": { "leaseId": lease, "operationKey": "restart-1" } });
    data(&server.graphql(&tenant, RESTART, input).await);
    wait_for_events(&server, &lease, "LeaseDispatchFailed", 1).await;
    // Back, holding the lease as still being provisioned (its callback far off).
    let sim = Sim::start_args(&port.to_string(), &dir.0, &["--callback-delay-ms", "600000"]).await;
    let secret = SigningSecret::new(SIM_SECRET.as_bytes()).expect("long enough");
    let client = BackendClient::new(
        BackendConfig::new("direct", &sim.url, secret),
        std::sync::Arc::new(leasehold_commands::SystemClock),
    )
    .expect("a client");
    let id = uuid::Uuid::parse_str(lease.as_str().expect("an id")).expect("a UUID");
    let request = ProvisionRequest {
        lease_uuid: id,
        tenant: "acme".into(),
        provider_uuid: uuid::Uuid::parse_str(PROVIDER).unwrap(),
        items: vec![LeaseItem {
            sku: "gpu.h100.1x".into(),
            quantity: 1,
            service_name: None,
            custom_domain: None,
        }],
        callback_url: format!("{}/nowhere", server.base),
        payload: None,
        payload_hash: None,
        lifecycle_callback_url: None,
    };
    client.provision(&request).await.expect("the backend takes it");
    let events = wait_for_events(&server, &lease, "LeaseMaintenanceFailed", 1).await;
    assert_eq!(count(&events, "LeaseMaintenanceSucceeded"), 0, "{events:?}");
    assert!(sim.received("restart").await >= 1, "the second attempt reached the backend");
    wait_for_status(&server, &tenant, &lease, "FAILED").await;
}

/// `serve --demo` runs a simulated backend in the same process: a requested lease becomes
/// ready with nothing else set up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_demo_makes_requested_leases_ready() {
    let server = Server::start_with(&["--demo"]).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "demo-1").await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseDispatched"), 1, "{events:?}");
}

/// A retained lease's restore goes to the backend that holds its data, whatever routing
/// would choose for a new lease; the restored lease becomes ready and the retained record is
/// consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_goes_to_the_backend_that_holds_the_data() {
    let dir = scratch();
    let holder =
        Sim::start_args("127.0.0.1:0", &dir.0, &["--retain", "--allocated-cpu-cores", "8"]).await;
    let other = Sim::start_args("127.0.0.1:0", &dir.0, &["--allocated-cpu-cores", "48"]).await;
    let gpu = json!({ "skus": ["gpu.h100.1x"] });
    let file = routed_backends_file(
        &dir.0,
        "backends.json",
        &[("holder", &holder.url, gpu.clone()), ("other", &other.url, gpu)],
    );
    let server = Server::start_with(&["--backends-file", file.to_str().unwrap()]).await;
    let tenant = tenant_token("acme");
    let source = ready_lease(&server, &tenant, "req-1").await;
    release(&server, &tenant, &source, "release-1").await;
    wait_for_status(&server, &tenant, &source, "RETAINED").await;

    let restore = "mutation($input: RestoreLeaseInput!) { restoreLease(input: $input) { id } }";
    let input = json!({ "input": {
        "operationKey": "restore-1", "fromLeaseId": source,
        "items": [{ "sku": "gpu.h100.1x", "quantity": 1 }],
    }});
    let restored =
        data(&server.graphql(&tenant, restore, input).await)["restoreLease"]["id"].clone();
    wait_for_status(&server, &tenant, &restored, "READY").await;
    assert_eq!((holder.received("restore").await, other.received("restore").await), (1, 0));
    assert_eq!(other.received("provision").await, 0);
    // The retained record is consumed by the restore.
    wait_for_status(&server, &tenant, &source, "DEPROVISIONED").await;
}

/// The tenant's manifest reaches the backend with its provision and its update (fred's
/// `payload`, checked there against its hash), and is kept only sealed: never in the log, and
/// not readable in its table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_travels_to_the_backend_and_rests_sealed() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    assert_eq!(sim.received("provision-payload").await, 1);
    let update = "mutation($input: UpdateLeaseInput!) { updateLease(input: $input) { id } }";
    let input = json!({ "input": { "leaseId": lease, "operationKey": "update-1", "payload": "image: trainer:2 # token s3cr3t" } });
    data(&server.graphql(&tenant, update, input).await);
    let events = wait_for_events(&server, &lease, "LeaseMaintenanceSucceeded", 1).await;
    assert_eq!(count(&events, "LeaseMaintenanceFailed"), 0, "{events:?}");
    let client = server.db.client().await;
    let in_log: i64 = client
        .query_one("SELECT count(*) FROM events WHERE payload::text LIKE '%s3cr3t%'", &[])
        .await
        .expect("counted")
        .get(0);
    assert_eq!(in_log, 0, "the manifest is not in the log");
    let rows = client.query("SELECT sealed FROM lease_manifests", &[]).await.expect("read");
    assert_eq!(rows.len(), 2, "the request's manifest and the update's");
    for row in rows {
        let sealed: Vec<u8> = row.get(0);
        let text = String::from_utf8_lossy(&sealed);
        assert!(!text.contains("s3cr3t") && !text.contains("trainer"), "sealed: {text}");
    }
}

/// The outbox row of the lease's work of generation `generation`: its state and whether it
/// still has an answer deadline.
async fn outbox_row(server: &Server, lease: &Value, generation: i64) -> Option<(String, bool)> {
    let client = server.db.client().await;
    let stream = format!("lease-{}", lease.as_str().expect("an id"));
    let row = client
        .query_opt(
            "SELECT state, answer_by IS NOT NULL FROM dispatch_outbox \
             WHERE stream_id = $1 AND generation = $2",
            &[&stream, &generation],
        )
        .await
        .expect("read");
    row.map(|row| (row.get(0), row.get(1)))
}

/// A backend that takes a provision and never calls back: past the callback deadline the
/// work fails (`CallbackTimeout`) and the pending lease is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_taken_and_never_called_back_fails_at_its_deadline() {
    let dir = scratch();
    let sim = Sim::start_args("127.0.0.1:0", &dir.0, &["--callback-delay-ms", "600000"]).await;
    let file = backends_file(&dir.0, &sim.url);
    let file = file.to_str().expect("a UTF-8 path");
    let server = Server::start_with(&[
        "--backend",
        "sim-1",
        "--backends-file",
        file,
        "--callback-deadline",
        "2s",
    ])
    .await;
    let tenant = tenant_token("acme");
    let lease = request_lease(&server, &tenant, "req-1").await["id"].clone();
    wait_for_status(&server, &tenant, &lease, "FAILED").await;
    let query = "query($id: ID!) { lease(id: $id) { reason chainState } }";
    let answer = server.graphql(&tenant, query, json!({ "id": lease })).await;
    assert_eq!(data(&answer)["lease"]["reason"], "CallbackTimeout", "{answer}");
    assert_eq!(data(&answer)["lease"]["chainState"], "REJECTED", "{answer}");
    let events = stream_events(&server, &lease).await;
    assert_eq!(
        events,
        ["LeaseProvisionRequested", "LeaseDispatched", "LeaseProvisionFailed", "LeaseRejected"]
    );
    assert_eq!(outbox_row(&server, &lease, 1).await, Some(("lapsed".into(), false)));
    assert_eq!(sim.received("provision").await, 1, "a lapse is not a reason to send again");
}

/// Work its backend settled in time keeps its outcome when its deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_settled_in_time_is_left_alone_at_its_deadline() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let file = backends_file(&dir.0, &sim.url);
    let file = file.to_str().expect("a UTF-8 path");
    // The simulator calls back after 20 ms: 5 s is ample even on a loaded machine.
    let server = Server::start_with(&[
        "--backend",
        "sim-1",
        "--backends-file",
        file,
        "--callback-deadline",
        "5s",
    ])
    .await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    eventually("the deadline handled", || async {
        (outbox_row(&server, &lease, 1).await == Some(("delivered".into(), false))).then_some(())
    })
    .await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(
        events,
        ["LeaseProvisionRequested", "LeaseDispatched", "LeaseProvisioned", "LeaseActivated"]
    );
}

/// A restore into another SKU tier is the backend's to judge: a demote whose retained data
/// does not fit fails the restore (`DemoteExceedsTier`, in the backend's words) and leaves the
/// retained data restorable; the same tier then restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demote_that_does_not_fit_fails_the_restore_and_keeps_the_data() {
    let dir = scratch();
    let sim =
        Sim::start_args("127.0.0.1:0", &dir.0, &["--retain", "--fault", "demote-overflow"]).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let tenant = tenant_token("acme");
    let source = ready_lease(&server, &tenant, "req-1").await;
    release(&server, &tenant, &source, "release-1").await;
    wait_for_status(&server, &tenant, &source, "RETAINED").await;

    let restore = "mutation($input: RestoreLeaseInput!) { restoreLease(input: $input) { id } }";
    let into = |key: &str, sku: &str| {
        json!({ "input": {
            "operationKey": key, "fromLeaseId": source,
            "items": [{ "sku": sku, "quantity": 1 }],
        }})
    };
    let demoted = server.graphql(&tenant, restore, into("restore-1", "gpu.a10.1x")).await;
    let demoted = data(&demoted)["restoreLease"]["id"].clone();
    wait_for_status(&server, &tenant, &demoted, "FAILED").await;
    let query = "query($id: ID!) { lease(id: $id) { reason message } }";
    let answer = server.graphql(&tenant, query, json!({ "id": demoted })).await;
    assert_eq!(data(&answer)["lease"]["reason"], "DemoteExceedsTier", "{answer}");
    let message = data(&answer)["lease"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("does not fit"), "{answer}");
    let retained = "{ retainedLeases { id status } }";
    eventually("the retained data restorable again", || async {
        let answer = server.graphql(&tenant, retained, json!({})).await;
        (data(&answer)["retainedLeases"] == json!([{ "id": source, "status": "active" }]))
            .then_some(())
    })
    .await;

    let same = server.graphql(&tenant, restore, into("restore-2", "gpu.h100.1x")).await;
    let restored = data(&same)["restoreLease"]["id"].clone();
    wait_for_status(&server, &tenant, &restored, "READY").await;
    assert_eq!(sim.received("restore").await, 2);
}

/// A backend that never answers holds back only its own work: a lease for another backend,
/// requested while the silent one's send is still waiting for an answer, is sent and ready at
/// once, not after that send times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_backend_never_holds_back_another_backends_work() {
    let dir = scratch();
    let silent = Sim::start_with("127.0.0.1:0", &dir.0, &["timeout"]).await;
    let answering = Sim::start("127.0.0.1:0", &dir.0).await;
    let file = routed_backends_file(
        &dir.0,
        "backends.json",
        &[
            ("silent", &silent.url, json!({ "skus": ["gpu.h100.1x"], "timeout_seconds": 60 })),
            ("answering", &answering.url, json!({ "default": true })),
        ],
    );
    let server = Server::start_with(&["--backends-file", file.to_str().unwrap()]).await;
    let tenant = tenant_token("acme");
    let waiting = request_sku(&server, &tenant, "gpu-1", "gpu.h100.1x").await;
    eventually("the silent backend holding a provision", || async {
        (silent.received("provision").await >= 1).then_some(())
    })
    .await;
    let lease = request_sku(&server, &tenant, "cpu-1", "cpu.small.1x").await;
    wait_for_status(&server, &tenant, &lease, "READY").await;
    // The silent backend's send is still waiting for its answer (60 s): nothing was recorded.
    let events = stream_events(&server, &waiting).await;
    assert_eq!(events, ["LeaseProvisionRequested"], "{events:?}");
}
