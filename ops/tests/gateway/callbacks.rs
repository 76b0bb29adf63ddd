//! Backend callbacks: HMAC-signed, fresh, bound to their URL, and the same fenced commands as
//! the agent mutations.

use chrono::{TimeDelta, Utc};
use leasehold_gateway::Role;
use leasehold_gateway::callbacks::{CallbackSecret, SIGNATURE_HEADER};
use serde_json::{Value, json};

use crate::support::*;

/// A signed callback, as a backend sends it.
struct Callback {
    path: String,
    body: Vec<u8>,
    signature: String,
}

impl Callback {
    fn signed(path: &str, body: &Value, signed_at: i64) -> Callback {
        let body = body.to_string().into_bytes();
        let secret = CallbackSecret::new(CALLBACK_SECRET.as_bytes()).expect("long enough");
        let signature = secret.sign(signed_at, "POST", path, &body);
        Callback { path: path.to_string(), body, signature }
    }

    fn now(path: &str, body: &Value) -> Callback {
        Callback::signed(path, body, Utc::now().timestamp())
    }

    async fn send(&self, server: &Server) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(format!("{}{}", server.base, self.path))
            .header(SIGNATURE_HEADER, &self.signature)
            .header("content-type", "application/json")
            .body(self.body.clone())
            .send()
            .await
            .expect("answers");
        (response.status().as_u16(), response.json().await.expect("JSON"))
    }
}

/// The callback path of the lease's current operation, as `leaseWork` names it.
async fn operation_path(server: &Server, lease: &Value) -> String {
    let work = lease_work(server, &lease["id"]).await;
    let path = work["callbackPath"].as_str().expect("a callback path").to_string();
    let operation = work["operationId"].as_str().expect("an operation");
    assert!(path.ends_with(&format!("/operations/{operation}")), "{work}");
    path
}

/// A lease requested as `token` and made ready by its backend's signed `success` callback.
async fn provisioned_by_callback(server: &Server, token: &str) -> Value {
    let lease = request_lease(server, token, "req-1").await;
    let body = json!({ "lease_uuid": lease["id"], "status": "success" });
    let path = operation_path(server, &lease).await;
    assert_eq!(Callback::now(&path, &body).send(server).await.0, 200);
    lease
}

/// Sends a callback signed now; the status and the answer.
async fn send(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    Callback::now(path, body).send(server).await
}

/// How many events the lease's stream holds.
async fn version_of(server: &Server, lease: &Value) -> i64 {
    let client = server.db.client().await;
    let stream = lease["streamId"].as_str().expect("a stream");
    let row =
        client.query_one("SELECT count(*) FROM events WHERE stream_id = $1", &[&stream]).await;
    row.expect("counted").get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_callback_provisions_and_its_redelivery_is_a_duplicate() {
    let server = Server::start().await;
    let lease = request_lease(&server, &tenant_token("acme"), "req-1").await;
    let id = lease["id"].as_str().expect("an id");
    let path = operation_path(&server, &lease).await;
    // `operation_id`, `lifecycle_id` and `backend` in the body carry no authority: ignored.
    let body = json!({ "lease_uuid": id, "status": "success", "operation_id": "forged", "lifecycle_id": "forged", "backend": "elsewhere" });
    let (status, answer) = Callback::now(&path, &body).send(&server).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["events"], json!(["LeaseProvisioned", "LeaseActivated"]));
    assert_eq!(answer["duplicate"], false);
    // The outbox delivers it again, signed anew.
    let again = Callback::signed(&path, &body, Utc::now().timestamp() - 30);
    let (status, answer) = again.send(&server).await;
    assert_eq!((status, &answer["duplicate"]), (200, &json!(true)), "{answer}");
    assert_eq!(version_of(&server, &lease).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_swapped_and_replayed_callbacks_append_nothing() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let other = request_lease(&server, &acme, "req-2").await;
    let id = lease["id"].as_str().expect("an id");
    let path = operation_path(&server, &lease).await;
    let body = json!({ "lease_uuid": id, "status": "success" });

    let mut forged = Callback::now(&path, &body);
    forged.signature = format!("sha256={}", "0".repeat(64));
    assert_eq!(forged.send(&server).await.0, 401);

    let old = Callback::signed(&path, &body, (Utc::now() - TimeDelta::minutes(6)).timestamp());
    assert_eq!(old.send(&server).await.0, 401);
    let ahead = Callback::signed(&path, &body, (Utc::now() + TimeDelta::minutes(2)).timestamp());
    assert_eq!(ahead.send(&server).await.0, 401);

    let mut swapped = Callback::now(&path, &body);
    swapped.body = json!({ "lease_uuid": id, "status": "failed", "error": "swapped" })
        .to_string()
        .into_bytes();
    assert_eq!(swapped.send(&server).await.0, 401);

    // Signed for this lease's URL, sent to the other lease's.
    let mut replayed = Callback::now(&path, &body);
    replayed.path = operation_path(&server, &other).await;
    assert_eq!(replayed.send(&server).await.0, 401);

    let mut unsigned = Callback::now(&path, &body);
    unsigned.signature = String::new();
    let (status, answer) = unsigned.send(&server).await;
    assert_eq!((status, answer["code"].as_str()), (401, Some("UNAUTHENTICATED")));

    // Validly signed, but the body names another lease than the URL.
    let mismatched = json!({ "lease_uuid": other["id"], "status": "success" });
    assert_eq!(Callback::now(&path, &mismatched).send(&server).await.0, 400);

    assert_eq!(version_of(&server, &lease).await, 1);
    assert_eq!(version_of(&server, &other).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_completion_is_fenced_by_its_admission_stamp() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = provisioned_by_callback(&server, &acme).await;
    let id = lease["id"].as_str().expect("an id");
    let restart = "mutation($input: LeaseOperationInput!) { restartLease(input: $input) { cursor events { type } } }";
    let restarted = server
        .graphql(&acme, restart, json!({ "input": { "leaseId": id, "operationKey": "restart-1" } }))
        .await;
    let cursor = &data(&restarted)["restartLease"]["cursor"];
    // The restart's event carries what the backend echoes: the maintenance id and admission.
    let page = "query($id: String!) { events(first: 10, filter: { streamIds: [$id], eventTypes: [\"LeaseRestartStarted\"] }) { edges { node { cursor payload } } } }";
    // Read after the restart's own cursor: the log's readers may lag the commit briefly.
    let read = json!({ "query": page, "variables": { "id": lease["streamId"] }, "extensions": { "minCursor": cursor } });
    let listed = server.graphql_with(&acme, read).await;
    let started = &data(&listed)["events"]["edges"][0]["node"];
    assert_eq!(&started["cursor"], cursor);
    let maintenance = started["payload"]["maintenance_id"].as_str().expect("a maintenance id");
    let admitted = started["payload"]["admitted_at"].as_str().expect("an admission stamp");
    assert!(started["payload"].get("generation").is_none(), "operator-only: {started}");

    let path = format!("/callbacks/leases/{id}/maintenance/{maintenance}");
    // Agents read the same fence, and the path to complete it, from `leaseWork`.
    let work = lease_work(&server, &lease["id"]).await;
    assert_eq!(
        (&work["maintenanceId"], &work["callbackPath"]),
        (&json!(maintenance), &json!(path))
    );
    assert_eq!(work["status"], "RESTARTING");
    let stale = json!({ "lease_uuid": id, "status": "success", "maintenance_admitted_at": "2020-01-01T00:00:00Z" });
    let (status, answer) = Callback::now(&path, &stale).send(&server).await;
    assert_eq!((status, answer["code"].as_str()), (409, Some("FENCED")), "{answer}");
    // The body's maintenance id is not authority: the URL's is.
    let current = json!({ "lease_uuid": id, "status": "success", "maintenance_admitted_at": admitted, "maintenance_id": "00000000-0000-0000-0000-000000000000" });
    let (status, answer) = Callback::now(&path, &current).send(&server).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["events"][0], "LeaseMaintenanceSucceeded");
}

/// Defect 7.4: a backend that predates the admission stamp (every public fred backend) omits
/// `maintenance_admitted_at`; its completion settles the pending maintenance its URL names by
/// the id alone. After that, an unstamped failure on the same URL is the running lease's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstamped_completion_settles_the_maintenance_its_url_names() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = provisioned_by_callback(&server, &acme).await;
    let id = lease["id"].as_str().expect("an id");
    let restart = "mutation($input: LeaseOperationInput!) { restartLease(input: $input) { id } }";
    let input = json!({ "input": { "leaseId": id, "operationKey": "restart-1" } });
    data(&server.graphql(&acme, restart, input).await);
    let work = lease_work(&server, &lease["id"]).await;
    let path = work["callbackPath"].as_str().expect("a maintenance path").to_string();
    assert!(path.contains("/maintenance/"), "{work}");

    let done = json!({ "lease_uuid": id, "status": "success" });
    let (status, answer) = Callback::now(&path, &done).send(&server).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["events"], json!(["LeaseMaintenanceSucceeded"]));
    // Its redelivery is a duplicate.
    let (status, answer) =
        Callback::signed(&path, &done, Utc::now().timestamp() - 5).send(&server).await;
    assert_eq!((status, &answer["duplicate"]), (200, &json!(true)), "{answer}");
    // The backend keeps the URL and reports a later container death there.
    let died = json!({ "lease_uuid": id, "status": "failed", "error": "exit 137" });
    let (status, answer) = Callback::now(&path, &died).send(&server).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["events"], json!(["LeaseFailed"]));
}

/// Defect 7.5: a backend rolls a failed restart back to the containers that ran before (fred
/// always does), and may say it rolled a failed update back (`rolled_back`): the lease stays
/// ready with the old release active, not failed `Unknown`. An update failure without the
/// note leaves it failed, with the backends' reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_maintenance_keeps_the_lease_ready_on_its_old_release() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = provisioned_by_callback(&server, &acme).await;
    let id = lease["id"].as_str().expect("an id");
    let restart = "mutation($input: LeaseOperationInput!) { restartLease(input: $input) { id } }";
    let update = "mutation($input: UpdateLeaseInput!) { updateLease(input: $input) { id } }";
    let failed = |note: Option<bool>| {
        let mut body = json!({ "lease_uuid": id, "status": "failed", "error": "exit 1" });
        if let Some(rolled_back) = note {
            body["rolled_back"] = json!(rolled_back);
        }
        body
    };
    let read = "query($id: ID!) { lease(id: $id) { status reason } }";
    let cases = [
        (restart, None, ["LeaseMaintenanceRecovered"], "READY", "RestartFailed"),
        (update, Some(true), ["LeaseMaintenanceRecovered"], "READY", "UpdateFailed"),
        (update, None, ["LeaseMaintenanceFailed"], "FAILED", "UpdateFailed"),
    ];
    for (n, (mutation, note, events, status, reason)) in cases.into_iter().enumerate() {
        let key = format!("maintenance-{n}");
        let input = if mutation == update {
            json!({ "input": { "leaseId": id, "operationKey": key, "payload": format!("image: trainer:{n}") } })
        } else {
            json!({ "input": { "leaseId": id, "operationKey": key } })
        };
        data(&server.graphql(&acme, mutation, input).await);
        let work = lease_work(&server, &lease["id"]).await;
        let path = work["callbackPath"].as_str().expect("a maintenance path").to_string();
        let mut body = failed(note);
        body["maintenance_admitted_at"] = work["admittedAt"].clone();
        let (code, answer) = Callback::now(&path, &body).send(&server).await;
        assert_eq!((code, &answer["events"]), (200, &json!(events)), "{answer}");
        // The backend resends the same callback (it got no answer in time): a duplicate,
        // never a report that fails the running lease.
        let again = Callback::signed(&path, &body, Utc::now().timestamp() - 5);
        let (code, answer) = again.send(&server).await;
        assert_eq!((code, &answer["duplicate"]), (200, &json!(true)), "{answer}");
        // The read model follows the log: wait for it to show the status.
        let got = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                let got = server.graphql(&acme, read, json!({ "id": id })).await;
                let shown = &got["data"]["lease"];
                if shown["status"] == status && shown["reason"] == reason {
                    return got;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the read model catches up");
        assert_eq!(data(&got)["lease"]["status"], status, "{got}");
        assert_eq!(data(&got)["lease"]["reason"], reason, "{got}");
        if status == "READY" {
            let client = server.db.client().await;
            let lease_id = uuid::Uuid::parse_str(id).expect("a UUID");
            let first = "SELECT status FROM releases WHERE lease_id = $1 AND version = 1";
            let row = client.query_one(first, &[&lease_id]).await.expect("release 1");
            assert_eq!(row.get::<_, String>(0), "active", "the old release runs");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_take_the_keys_its_backend_or_agents_will_use() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let id = lease["id"].as_str().expect("an id");
    let path = operation_path(&server, &lease).await;
    let body = json!({ "lease_uuid": id, "status": "success" });
    // The tenant knows how a callback's key is made and uses it first, and the key its
    // provider's agent will use for the report.
    let digest = {
        use sha2::Digest as _;
        let mut digest = sha2::Sha256::new();
        digest.update(format!("{path}\n{body}").as_bytes());
        hex::encode(digest.finalize())
    };
    let callback_key = format!("callback-{}", &digest[..40]);
    request_lease(&server, &acme, &callback_key).await;
    request_lease(&server, &acme, "up-1").await;

    // Each kind of caller has its own keys: the callback and the agent's report go through.
    let (status, answer) = Callback::now(&path, &body).send(&server).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["duplicate"], false);
    let other = request_lease(&server, &acme, "req-2").await;
    let input = report_input(&server, &other["id"], "up-1").await;
    let reported = server.graphql(&role_token(Role::Agent, None), REPORT_PROVISIONED, input).await;
    let events = &data(&reported)["reportLeaseProvisioned"]["events"];
    assert_eq!(events, &json!([{ "type": "LeaseProvisioned" }, { "type": "LeaseActivated" }]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_report_for_a_new_provisioning_cycle_settles_it_and_a_superseded_one_is_fenced() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let id = lease["id"].as_str().expect("an id");
    let first = operation_path(&server, &lease).await;
    let success = json!({ "lease_uuid": id, "status": "success" });
    let failed = json!({ "lease_uuid": id, "status": "failed", "error": "exit 1" });
    assert_eq!(send(&server, &first, &success).await.1["events"][0], "LeaseProvisioned");
    assert_eq!(send(&server, &first, &failed).await.1["events"], json!(["LeaseFailed"]));

    // The tenant asks again: a new operation, and the backend is given a new callback URL.
    let mut again = lease_request("req-2");
    again["input"]["leaseId"] = lease["id"].clone();
    let retried = server.graphql(&acme, REQUEST_LEASE, again).await;
    assert_eq!(data(&retried)["requestLease"]["events"][0]["type"], "LeaseProvisionRequested");
    let second = operation_path(&server, &lease).await;
    assert_ne!(first, second, "each provision has its own operation");

    // The backend's report of the new cycle has the very same body as the first one's: it
    // settles the new cycle instead of being taken for a redelivery.
    let (status, answer) = send(&server, &second, &success).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (&answer["duplicate"], &answer["events"]),
        (&json!(false), &json!(["LeaseProvisioned"]))
    );
    // And so does a failure identical to the first cycle's.
    let (status, answer) = send(&server, &second, &failed).await;
    assert_eq!((status, &answer["events"]), (200, &json!(["LeaseFailed"])), "{answer}");
    // A redelivery within the second cycle is a duplicate.
    let (status, answer) = send(&server, &second, &failed).await;
    assert_eq!((status, &answer["duplicate"]), (200, &json!(true)), "{answer}");
    // A report on the superseded first cycle that was never delivered before is fenced.
    let late = json!({ "lease_uuid": id, "status": "failed", "error": "exit 2" });
    let (status, answer) = send(&server, &first, &late).await;
    assert_eq!((status, answer["code"].as_str()), (409, Some("FENCED")), "{answer}");
    // The URL of the older protocol names no operation: refused, nothing appended.
    let (status, answer) = send(&server, &format!("/callbacks/leases/{id}"), &success).await;
    assert_eq!((status, answer["code"].as_str()), (404, Some("NOT_FOUND")), "{answer}");
    assert_eq!(version_of(&server, &lease).await, 7);
}
