//! `work`: a backend that cannot be called (behind NAT) subscribes to its work over WebSocket
//! and answers by signed callback, as any backend does. Agents only, their provider's leases
//! only; from the start (no cursor) or from a cursor, only work still awaited is delivered; a
//! backend the dispatcher calls cannot take its work here.

use leasehold_gateway::Role;
use leasehold_gateway::callbacks::{CallbackSecret, SIGNATURE_HEADER};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::backend::*;
use crate::socket::Socket;
use crate::support::*;

const WORK: &str = "subscription($backend: String!, $after: String) {
    work(backend: $backend, after: $after) { cursor leaseId action generation request }
}";

/// The next work item of operation `id`.
async fn item(socket: &mut Socket, id: &str) -> Value {
    let wait = std::time::Duration::from_secs(60);
    let message = tokio::time::timeout(wait, socket.message())
        .await
        .unwrap_or_else(|_| panic!("no work item on {id} in {wait:?}"));
    assert_eq!(message["id"], id, "{message}");
    assert!(message["payload"].get("errors").is_none(), "{message}");
    message["payload"]["data"]["work"].clone()
}

/// Posts `body` to the callback URL `url`, signed with `secret` as a backend signs it.
async fn call_back(url: &str, secret: &str, body: &Value) -> u16 {
    let body = body.to_string().into_bytes();
    let path = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = &path[path.find('/').expect("a path")..];
    let signer = CallbackSecret::new(secret.as_bytes()).expect("long enough");
    let signature = signer.sign(chrono::Utc::now().timestamp(), "POST", path, &body);
    let answer = reqwest::Client::new()
        .post(url)
        .header(SIGNATURE_HEADER, signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answers");
    answer.status().as_u16()
}

/// A lease request for `provider`.
fn request_for(key: &str, provider: &str) -> Value {
    let mut request = lease_request(key);
    request["input"]["providerId"] = json!(provider);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_takes_its_providers_work_by_subscription_and_answers_by_callback() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let provider = Uuid::parse_str(PROVIDER).expect("a UUID");
    let agent = role_token(Role::Agent, Some(provider));
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &agent).await;
    socket.subscribe("work", WORK, json!({ "backend": "local" })).await;

    let first = request_lease(&server, &acme, "req-1").await;
    let work = item(&mut socket, "work").await;
    assert_eq!(
        (work["leaseId"].clone(), work["action"].as_str()),
        (first["id"].clone(), Some("provision"))
    );
    let request = &work["request"];
    assert_eq!(request["lease_uuid"], first["id"]);
    assert_eq!(request["tenant"], "acme", "the backend is told whose lease it runs");
    // The manifest travels with it, as fred's `payload` (base64) beside its hash.
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(request["payload"].as_str().expect("a payload"))
        .expect("base64");
    assert_eq!(payload, b"image: trainer:1");
    let url = request["callback_url"].as_str().expect("a callback URL");
    let body = json!({ "lease_uuid": first["id"], "status": "success" });
    assert_eq!(call_back(url, CALLBACK_SECRET, &body).await, 200);
    wait_for_status(&server, &acme, &first["id"], "READY").await;

    // Resuming from the first item's cursor: settled work is not replayed; new work is.
    let mut resumed = Socket::connect(&server, "graphql-transport-ws", &agent).await;
    resumed.subscribe("again", WORK, json!({ "backend": "local", "after": work["cursor"] })).await;
    // Another provider's agent sees nothing of this provider's leases.
    let other = Uuid::now_v7();
    let stranger = role_token(Role::Agent, Some(other));
    let mut theirs = Socket::connect(&server, "graphql-transport-ws", &stranger).await;
    theirs.subscribe("theirs", WORK, json!({ "backend": "local" })).await;
    let second = request_lease(&server, &acme, "req-2").await;
    let foreign =
        server.graphql(&acme, REQUEST_LEASE, request_for("req-3", &other.to_string())).await;
    let foreign = data(&foreign)["requestLease"].clone();
    assert_eq!(item(&mut resumed, "again").await["leaseId"], second["id"]);
    assert_eq!(item(&mut theirs, "theirs").await["leaseId"], foreign["id"]);

    // Releasing it: the agent gets the release with a URL to report it on.
    release(&server, &acme, &first["id"], "release-1").await;
    let mut skipped = Vec::new();
    let released = loop {
        let next = item(&mut socket, "work").await;
        if next["action"] == "deprovision" {
            break next;
        }
        skipped.push(next["leaseId"].clone());
    };
    assert_eq!(skipped, [second["id"].clone()], "its own provider's new work, in order");
    let url = released["request"]["callback_url"].as_str().expect("a callback URL");
    let body = json!({ "lease_uuid": first["id"], "status": "deprovisioned" });
    assert_eq!(call_back(url, CALLBACK_SECRET, &body).await, 200);
    wait_for_status(&server, &acme, &first["id"], "DEPROVISIONED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_agents_subscribe_and_never_to_a_backend_the_dispatcher_calls() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let file = dir.0.join("backends.json");
    std::fs::write(dir.0.join("edge.secret"), "edge-behind-nat-secret-0123456789abcdef").unwrap();
    let backends = json!({ "backends": [
        { "name": "sim-1", "url": sim.url, "secret_file": "sim.secret" },
        { "name": "edge", "secret_file": "edge.secret", "subscribes": true, "default": true },
    ]});
    std::fs::write(dir.0.join("sim.secret"), SIM_SECRET).unwrap();
    std::fs::write(&file, backends.to_string()).unwrap();
    let server = Server::start_with(&["--backends-file", file.to_str().unwrap()]).await;

    let acme = tenant_token("acme");
    let mut tenant = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    tenant.subscribe("work", WORK, json!({ "backend": "edge" })).await;
    let refused = tenant.message().await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["payload"][0]["extensions"]["code"], "FORBIDDEN", "{refused}");

    let agent = role_token(Role::Agent, None);
    let mut called = Socket::connect(&server, "graphql-transport-ws", &agent).await;
    called.subscribe("work", WORK, json!({ "backend": "sim-1" })).await;
    let refused = called.message().await;
    assert_eq!(refused["payload"][0]["extensions"]["code"], "BAD_USER_INPUT", "{refused}");

    // The edge backend takes every SKU nobody lists; it is never called, so its agent takes
    // the work and answers with its own secret.
    // Requested before its agent connects: the agent learns it when it does.
    let lease = request_lease(&server, &acme, "req-1").await;
    let mut edge = Socket::connect(&server, "graphql-transport-ws", &agent).await;
    edge.subscribe("work", WORK, json!({ "backend": "edge" })).await;
    let work = item(&mut edge, "work").await;
    assert_eq!(work["leaseId"], lease["id"]);
    let url = work["request"]["callback_url"].as_str().expect("a callback URL");
    let body = json!({ "lease_uuid": lease["id"], "status": "success" });
    assert_eq!(call_back(url, CALLBACK_SECRET, &body).await, 401, "only edge's own secret");
    let edge_secret = "edge-behind-nat-secret-0123456789abcdef";
    assert_eq!(call_back(url, edge_secret, &body).await, 200);
    wait_for_status(&server, &acme, &lease["id"], "READY").await;
    assert_eq!(sim.received("provision").await, 0);
    let events = stream_events(&server, &lease["id"]).await;
    assert_eq!(count(&events, "LeaseDispatched"), 0, "nothing was sent: {events:?}");
}

/// Work handed to a backend behind NAT has the same callback deadline as work sent: an agent
/// that never takes it, or never answers, fails it in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_handed_out_and_never_answered_fails_at_its_deadline() {
    let dir = scratch();
    let file = dir.0.join("backends.json");
    std::fs::write(dir.0.join("edge.secret"), "edge-behind-nat-secret-0123456789abcdef").unwrap();
    let backends = json!({ "backends": [
        { "name": "edge", "secret_file": "edge.secret", "subscribes": true },
    ]});
    std::fs::write(&file, backends.to_string()).unwrap();
    let file = file.to_str().expect("UTF-8");
    let server = Server::start_with(&["--backends-file", file, "--callback-deadline", "2s"]).await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await["id"].clone();
    wait_for_status(&server, &acme, &lease, "FAILED").await;
    let query = "query($id: ID!) { lease(id: $id) { reason } }";
    let answer = server.graphql(&acme, query, json!({ "id": lease })).await;
    assert_eq!(data(&answer)["lease"]["reason"], "CallbackTimeout", "{answer}");
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseDispatched"), 0, "handed out, never sent: {events:?}");
}
