//! The lease data that lives at its backend, read through to `leasehold backend-sim` (a
//! separate process): a lease's connection and logs for its owner only, with only the
//! declared fields; `NOT_PROVISIONED` when it is not running, distinct from `NOT_FOUND`;
//! `UNAVAILABLE` while its backend is down. Beside them, the tenant's retained leases and the
//! operators' diagnostics.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_gateway::Role;
use serde_json::{Value, json};

use crate::backend::*;
use crate::support::*;

const CONNECTION: &str = "query($id: ID!) { leaseConnection(id: $id) { host fqdn protocol \
    ports { port hostIp hostPort } instances { index image status fqdn ports { port } } \
    services { name } } }";

const LOGS: &str =
    "query($id: ID!, $tail: Int) { leaseLogs(id: $id, tail: $tail) { instance text } }";

const RETAINED: &str = "{ retainedLeases { id providerId status retainedUntil } }";

const DIAGNOSTICS: &str = "query($id: ID!) { leaseDiagnostics(id: $id) { id tenant backend \
    lastError failCount generation budget { verdict } } }";

async fn connection(server: &Server, token: &str, lease: &Value) -> Value {
    server.graphql(token, CONNECTION, json!({ "id": lease })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_connection_and_logs_come_from_its_backend_for_its_owner_only() {
    let dir = scratch();
    let sim = Sim::start_args("127.0.0.1:0", &dir.0, &["--retain"]).await;
    let file = backends_file(&dir.0, &sim.url);
    let file = file.to_str().expect("a UTF-8 path");
    let args = ["--backend", "sim-1", "--backends-file", file, "--retention-max-age", "1d"];
    let server = Server::start_with(&args).await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let lease = ready_lease(&server, &acme, "req-1").await;
    let id = lease.as_str().expect("an id");

    let answer = connection(&server, &acme, &lease).await;
    let view = &data(&answer)["leaseConnection"];
    assert_eq!(view["host"], "127.0.0.1");
    assert_eq!(view["fqdn"], format!("{id}.sim-1.sim.local"));
    assert_eq!(
        view["ports"],
        json!([{ "port": "80/tcp", "hostIp": "127.0.0.1", "hostPort": "8080" }])
    );
    assert_eq!(view["instances"][0]["image"], "sim/app:1");
    assert_eq!(view["instances"][0]["status"], "running");
    // Only the declared fields: the container id and free-form metadata stay at the backend.
    let text = answer.to_string();
    assert!(!text.contains("sim-container") && !text.contains("/var/lib"), "{text}");

    let logs = server.graphql(&acme, LOGS, json!({ "id": lease, "tail": 2 })).await;
    assert_eq!(
        data(&logs)["leaseLogs"],
        json!([{ "instance": "0", "text": format!("{id} line 2\n{id} line 3") }])
    );
    // Releases come from the log, each image from the backend.
    let releases = "query($id: ID!) { leaseReleases(id: $id) { version status image } }";
    let answer = server.graphql(&acme, releases, json!({ "id": lease })).await;
    assert_eq!(
        data(&answer)["leaseReleases"],
        json!([{ "version": 1, "status": "active", "image": "sim/app:1" }])
    );
    let too_long = server.graphql(&acme, LOGS, json!({ "id": lease, "tail": 0 })).await;
    assert_eq!(code(&too_long), Some("BAD_USER_INPUT"), "{too_long}");

    // Another tenant's lease, and no lease at all, are not found, never forbidden.
    assert_eq!(code(&connection(&server, &globex, &lease).await), Some("NOT_FOUND"));
    let theirs = server.graphql(&globex, LOGS, json!({ "id": lease })).await;
    assert_eq!(code(&theirs), Some("NOT_FOUND"), "{theirs}");
    let unknown = json!(uuid::Uuid::now_v7().to_string());
    assert_eq!(code(&connection(&server, &acme, &unknown).await), Some("NOT_FOUND"));
    assert_eq!(sim.received("logs").await, 1, "refused reads never reach the backend");
    assert_eq!(sim.received("releases").await, 1);

    // Released with its data kept: not provisioned, and listed as retained for its owner.
    release(&server, &acme, &lease, "release-1").await;
    wait_for_status(&server, &acme, &lease, "RETAINED").await;
    let released = connection(&server, &acme, &lease).await;
    assert_eq!(code(&released), Some("NOT_PROVISIONED"), "{released}");
    let retained =
        data(&server.graphql(&acme, RETAINED, json!({})).await)["retainedLeases"].clone();
    assert_eq!(retained[0]["id"], lease);
    assert_eq!(retained[0]["status"], "active");
    let until: DateTime<Utc> =
        retained[0]["retainedUntil"].as_str().expect("a deadline").parse().unwrap();
    let from_now = until - Utc::now();
    assert!(from_now > TimeDelta::hours(23) && from_now <= TimeDelta::days(1), "{until}");
    let none = server.graphql(&globex, RETAINED, json!({})).await;
    assert_eq!(data(&none)["retainedLeases"], json!([]));

    // Operators read the diagnostics; tenants may not.
    let operator = role_token(Role::Operator, None);
    let diagnostics = server.graphql(&operator, DIAGNOSTICS, json!({ "id": lease })).await;
    let view = &data(&diagnostics)["leaseDiagnostics"];
    assert_eq!((view["tenant"].as_str(), view["backend"].as_str()), (Some("acme"), Some("sim-1")));
    let refused = server.graphql(&acme, DIAGNOSTICS, json!({ "id": lease })).await;
    assert_eq!(code(&refused), Some("FORBIDDEN"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_is_down_makes_a_read_through_unavailable() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let server = serve_dispatching(&backends_file(&dir.0, &sim.url)).await;
    let acme = tenant_token("acme");
    let lease = ready_lease(&server, &acme, "req-1").await;
    drop(sim);
    let answer = connection(&server, &acme, &lease).await;
    assert_eq!(code(&answer), Some("UNAVAILABLE"), "{answer}");
    let message = answer["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("127.0.0.1"), "the backend's address stays in the log: {message}");
    let logs = server.graphql(&acme, LOGS, json!({ "id": lease })).await;
    assert_eq!(code(&logs), Some("UNAVAILABLE"), "{logs}");
    // The releases still come from the log; only their images are missing.
    let releases = "query($id: ID!) { leaseReleases(id: $id) { version image } }";
    let answer = server.graphql(&acme, releases, json!({ "id": lease })).await;
    assert_eq!(data(&answer)["leaseReleases"], json!([{ "version": 1, "image": null }]));
}
