//! The node-agent protocol through a real `leasehold serve`: a node on a rented machine
//! enrolls with its bootstrap's single-use token, beats, takes its launch from its session
//! stream (ordered by the run dispatcher once the tenant's run is booked), reports the
//! launch applied and the workload exited; a partitioned node's reports after its
//! re-enrollment are refused (409) and append nothing; no token text reaches the log.

use leasehold_commands::enrollment::{EnrollmentKey, node_of};
use leasehold_domain::node::NodeId;
use leasehold_domain::rental::RentalId;
use leasehold_gateway::Role;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::backend::eventually;
use crate::rented::{
    ENROLLMENT_KEY, RUN, SUBMIT, active_rental, rented_server, rented_server_logging,
};
use crate::support::*;

/// A node agent: the protocol's HTTP calls, as mercator's agent makes them.
struct Agent {
    http: reqwest::Client,
    base: String,
    node: Uuid,
}

impl Agent {
    async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
        let mut request = self.http.post(format!("{}/v1/node-agent{path}", self.base)).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn enroll(&self, rental: &str, generation: u64, token: &str) -> (u16, Value) {
        let body = json!({
            "node_id": self.node, "rental_id": rental, "generation": generation,
            "enrollment_token": token, "agent_version": "1.0.0", "facts": facts(),
        });
        self.post("/enroll", None, &body).await
    }

    async fn events(&self, session: &str, events: Value) -> (u16, Value) {
        let path = format!("/{}/events", self.node);
        self.post(&path, Some(session), &json!({ "events": events })).await
    }

    async fn session(&self, session: &str) -> reqwest::Response {
        let url = format!("{}/v1/node-agent/{}/session", self.base, self.node);
        let stream = self.http.post(url).bearer_auth(session).send().await.expect("it opens");
        assert_eq!(stream.status().as_u16(), 200);
        stream
    }

    async fn result(&self, session: &str, operation: &str, applied: bool) -> (u16, Value) {
        let body = json!({
            "operation_id": operation, "applied": applied, "duplicate": false,
            "reported_at": "2026-12-03T15:00:00Z",
        });
        self.post(&format!("/{}/results", self.node), Some(session), &body).await
    }
}

fn facts() -> Value {
    json!({
        "observed_at": "2026-12-03T15:00:00Z",
        "host": { "os": "linux", "architecture": "amd64", "container_runtime": "docker",
                  "runtime_version": "27.1", "cpu_millis": 4000, "memory_bytes": 17179869184u64,
                  "disk_free_bytes": 1000000000 },
    })
}

/// The next command line of a session stream.
async fn next_command(stream: &mut reqwest::Response, buffer: &mut Vec<u8>) -> Value {
    let read = async {
        loop {
            if let Some(end) = buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                return serde_json::from_slice(&line).expect("an NDJSON line");
            }
            let chunk = stream.chunk().await.expect("readable").expect("the stream stays open");
            buffer.extend_from_slice(&chunk);
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), read).await.expect("a command in time")
}

/// acme's active rental `r-1` on `server`, and the agent of its generation-1 node with its
/// bootstrap's enrollment token: (the rental's id as GraphQL gives it, its text, the node,
/// the token, the agent).
async fn rental_and_agent(server: &Server, acme: &str) -> (Value, String, NodeId, String, Agent) {
    let rental = active_rental(server, acme, "r-1").await;
    let rental_text = rental.as_str().expect("an id").to_string();
    let node = node_of(RentalId(Uuid::parse_str(&rental_text).expect("a UUID")), 1);
    let token = EnrollmentKey::new(ENROLLMENT_KEY.as_bytes()).expect("long").enrollment_token(node);
    let agent = Agent { http: reqwest::Client::new(), base: server.base.clone(), node: node.0 };
    (rental, rental_text, node, token, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_enrolls_takes_its_launch_and_reports_fenced_over_the_agent_protocol() {
    let (server, _dir) = rented_server().await;
    let acme = tenant_token("acme");
    let (rental, rental_text, node, token, agent) = rental_and_agent(&server, &acme).await;
    // A wrong token, or the right one for another generation: refused alike, saying nothing.
    for (generation, presented) in [(1, "0".repeat(64)), (2, token.clone())] {
        let (status, body) = agent.enroll(&rental_text, generation, &presented).await;
        assert_eq!((status, body["code"].as_str()), (401, Some("ENROLLMENT_REFUSED")), "{body}");
    }
    let (status, enrolled) = agent.enroll(&rental_text, 1, &token).await;
    assert_eq!(status, 200, "{enrolled}");
    assert_eq!(
        (enrolled["fencing_token"].as_u64(), enrolled["duplicate"].as_bool()),
        (Some(1), Some(false))
    );
    let session = enrolled["session_token"].as_str().expect("a session token").to_string();
    let (status, _) = agent.enroll(&rental_text, 1, &token).await;
    assert_eq!(status, 401, "the bootstrap token is single-use");
    // A heartbeat with facts, twice (a replayed spool): accepted both times.
    let beat = json!([{ "id": format!("{}-1", node.0), "node_id": node.0, "kind": "heartbeat",
                         "observed_at": "2026-12-03T15:00:20Z", "facts": facts() }]);
    for _ in 0..2 {
        let (status, body) = agent.events(&session, beat.clone()).await;
        assert_eq!(status, 202, "{body}");
    }
    // The session stream; the tenant's run is booked and the dispatcher orders its launch.
    let mut stream = agent.session(&session).await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "b".repeat(64)), "maxRuntimeSeconds": 3600,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit).await;
    let run = data(&submitted)["submitRun"]["id"].as_str().expect("an id").to_string();
    let mut buffer = Vec::new();
    let launch = next_command(&mut stream, &mut buffer).await;
    assert_eq!(
        (launch["kind"].as_str(), launch["fencing_token"].as_u64()),
        (Some("launch_workload"), Some(1))
    );
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(launch["payload"].as_str().expect("a payload"))
        .expect("base64");
    let payload: Value = serde_json::from_slice(&payload).expect("JSON");
    assert_eq!(payload["run"], run, "{payload}");
    let attempt = payload["attempt"].clone();
    let operation = launch["operation_id"].as_str().expect("an id").to_string();
    let (status, body) = agent.result(&session, &operation, true).await;
    assert_eq!(status, 202, "{body}");
    // Running, then a look with an exit code while running: no outcome; exited 0: succeeded.
    let look = |n: u32, phase: &str, code: Option<i32>| {
        json!([{ "id": format!("{}-w{n}", node.0), "node_id": node.0, "kind": "workload",
                  "observed_at": "2026-12-03T15:01:00Z",
                  "workload": { "run_id": run, "attempt_id": attempt, "phase": phase,
                                "observed_at": "2026-12-03T15:01:00Z", "exit_code": code } }])
    };
    assert_eq!(agent.events(&session, look(1, "running", Some(0))).await.0, 202);
    let read = server.graphql(&acme, RUN, json!({ "id": run })).await;
    assert_eq!(data(&read)["run"]["outcome"], Value::Null, "{read}");
    assert_eq!(agent.events(&session, look(2, "exited", Some(0))).await.0, 202);
    eventually("the run's outcome recorded", || async {
        let read = server.graphql(&acme, RUN, json!({ "id": run })).await;
        (read["data"]["run"]["outcome"] == "succeeded").then_some(())
    })
    .await;
    // The node re-enrolls (a resume): its old session's reports are refused, nothing appended.
    let (status, resumed) = agent.enroll(&rental_text, 1, &session).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(
        (resumed["fencing_token"].as_u64(), resumed["duplicate"].as_bool()),
        (Some(2), Some(true))
    );
    let operator = role_token(Role::Operator, None);
    let count = || async {
        let page = server
            .graphql(&operator, "{ events(first: 100, filter: { streamTypes: [\"node\", \"run\"] }) { edges { node { type payload } } } }", json!({}))
            .await;
        data(&page)["events"]["edges"].clone()
    };
    // The log's readers show the re-enrollment once its commit is below the horizon.
    let before = eventually("the re-enrollment in the log", || async {
        let edges = count().await;
        let enrolled = edges
            .as_array()
            .is_some_and(|edges| edges.iter().any(|e| e["node"]["payload"]["fencing_token"] == 2));
        enrolled.then_some(edges)
    })
    .await;
    let (status, body) = agent.events(&session, look(3, "exited", Some(1))).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("EVENTS_REJECTED")), "{body}");
    let (status, body) = agent.result(&session, &operation, false).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(count().await, before, "a fenced report appends nothing");
    // Neither the bootstrap token nor a session token is anywhere in the log.
    let log = before.to_string();
    let current = resumed["session_token"].as_str().expect("a token");
    for secret in [token.as_str(), session.as_str(), current] {
        assert!(!log.contains(secret), "a token in the log");
    }
    // Without a session, or with another node's path: refused.
    let (status, body) =
        agent.post(&format!("/{}/events", node.0), None, &json!({ "events": [] })).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("SESSION_REQUIRED")));
    let other = format!("/{}/events", Uuid::now_v7());
    let (status, body) = agent.post(&other, Some(current), &json!({ "events": [] })).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("SESSION_REFUSED")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_credential_reaches_a_log_line_even_at_debug() {
    let (server, dir) = rented_server_logging("debug").await;
    let acme = tenant_token("acme");
    let (_, rental_text, node, token, agent) = rental_and_agent(&server, &acme).await;
    // Refused: another generation, then (after the first enrollment) the token used again.
    assert_eq!(agent.enroll(&rental_text, 2, &token).await.0, 401);
    let (status, first) = agent.enroll(&rental_text, 1, &token).await;
    assert_eq!(status, 200, "{first}");
    let first = first["session_token"].as_str().expect("a token").to_string();
    assert_eq!(agent.enroll(&rental_text, 1, &token).await.0, 401, "single-use");
    let beat = json!([{ "id": format!("{}-1", node.0), "node_id": node.0, "kind": "heartbeat",
                         "observed_at": "2026-12-03T15:00:20Z", "facts": facts() }]);
    assert_eq!(agent.events(&first, beat).await.0, 202);
    // A resume with the session token, a renewal, and the closed session refused.
    let (status, resumed) = agent.enroll(&rental_text, 1, &first).await;
    assert_eq!(status, 200, "{resumed}");
    let resumed = resumed["session_token"].as_str().expect("a token").to_string();
    let (status, renewed) =
        agent.post(&format!("/{}/renew", node.0), Some(&resumed), &json!({})).await;
    assert_eq!(status, 200, "{renewed}");
    let renewed = renewed["session_token"].as_str().expect("a token").to_string();
    let late = json!([{ "id": format!("{}-2", node.0), "node_id": node.0, "kind": "heartbeat",
                         "observed_at": "2026-12-03T15:00:40Z", "facts": facts() }]);
    assert_eq!(agent.events(&first, late).await.0, 409, "the first session is closed");
    assert_eq!(
        agent.enroll(&rental_text, 1, &first).await.0,
        401,
        "a closed session resumes nothing"
    );
    // The server logged each enrollment and refusal (so its log is read here at all)...
    let logs = eventually("the enrollments and refusals logged", || async {
        let logs = server.logs();
        let refused = logs.matches("an enrollment was refused").count();
        (refused >= 3 && logs.matches("a node enrolled").count() >= 2).then_some(logs)
    })
    .await;
    assert!(logs.contains(&node.0.to_string()), "the node is named");
    // ...and no token, credential, key or secret is anywhere in it.
    let provider_token = std::fs::read_to_string(dir.0.join("sim.token")).expect("readable");
    let secrets = [
        token.as_str(),
        first.as_str(),
        resumed.as_str(),
        renewed.as_str(),
        acme.as_str(),
        provider_token.trim(),
        ENROLLMENT_KEY,
        SECRET,
        CALLBACK_SECRET,
    ];
    for (index, secret) in secrets.into_iter().enumerate() {
        assert!(!logs.contains(secret), "secret {index} is in a log line");
    }
}

/// Facts as mercator's agent sends them, every field it has.
fn mercator_facts() -> Value {
    json!({
        "observed_at": "2026-12-03T15:00:00Z",
        "host": { "os": "linux", "kernel_version": "6.8.0", "architecture": "amd64",
                  "container_runtime": "docker", "runtime_version": "27.1",
                  "accelerator_toolkit": "cuda", "driver_version": "550.54",
                  "driver_capability": "12.4",
                  "accelerators": [{ "vendor": "nvidia", "model": "L4", "count": 1 }],
                  "cpu_millis": 4000, "memory_bytes": 17179869184u64,
                  "disk_total_bytes": 2000000000, "disk_free_bytes": 1000000000,
                  "network": [{ "interface": "eth0", "bandwidth_mbps": 10000 }] },
        "images": [{ "manifest_digest": format!("sha256:{}", "c".repeat(64)),
                     "platform": { "os": "linux", "architecture": "amd64" },
                     "layer_digests": [format!("sha256:{}", "d".repeat(64))],
                     "missing_layer_digests": [], "missing_compressed_bytes": 0,
                     "unpacked": true, "state": "hot",
                     "last_verified_at": "2026-12-03T14:59:00Z" }],
        "artifacts": [], "caches": [],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_replayed_after_a_resume_is_recorded_once_and_a_bad_event_never_stalls_it() {
    let (server, _dir) = rented_server().await;
    let acme = tenant_token("acme");
    let (rental, rental_text, node, token, agent) = rental_and_agent(&server, &acme).await;
    // mercator's agent sends all its facts, and a workspace on every event: all accepted.
    let body = json!({
        "node_id": node.0, "rental_id": rental_text, "generation": 1,
        "enrollment_token": token, "agent_version": "1.0.0", "facts": mercator_facts(),
    });
    let (status, first) = agent.post("/enroll", None, &body).await;
    assert_eq!(status, 200, "{first}");
    let first = first["session_token"].as_str().expect("a token").to_string();
    // A batch whose first event can never be recorded (a look at a run that is not this
    // node's), then two heartbeats: the bad one is skipped and named, the rest recorded.
    let spool = json!([
        { "id": format!("{}-1", node.0), "node_id": node.0, "workspace_id": "", "kind": "workload",
          "observed_at": "2026-12-03T15:00:10Z",
          "workload": { "run_id": Uuid::now_v7(), "attempt_id": Uuid::now_v7(),
                        "phase": "running", "observed_at": "2026-12-03T15:00:10Z" } },
        { "id": format!("{}-2", node.0), "node_id": node.0, "workspace_id": "", "kind": "heartbeat",
          "observed_at": "2026-12-03T15:00:20Z", "facts": mercator_facts() },
        { "id": format!("{}-3", node.0), "node_id": node.0, "workspace_id": "", "kind": "heartbeat",
          "observed_at": "2026-12-03T15:00:40Z", "facts": mercator_facts() },
    ]);
    let (status, answer) = agent.events(&first, spool.clone()).await;
    assert_eq!(status, 202, "{answer}");
    let skipped = answer["skipped"].as_array().expect("the skipped events");
    assert_eq!(skipped.len(), 1, "{answer}");
    assert_eq!(
        (skipped[0]["index"].as_u64(), skipped[0]["code"].as_str()),
        (Some(0), Some("EVENTS_REJECTED"))
    );
    // The tenant's run is booked; its launch is ordered under the first session.
    let mut stream = agent.session(&first).await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "b".repeat(64)), "maxRuntimeSeconds": 3600,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit).await;
    let run = data(&submitted)["submitRun"]["id"].as_str().expect("an id").to_string();
    let mut buffer = Vec::new();
    let launch = next_command(&mut stream, &mut buffer).await;
    let launch_op = launch["operation_id"].as_str().expect("an id").to_string();
    drop(stream);
    // The node resumes before answering. Its replayed spool is the recorded one: nothing new.
    let (status, resumed) = agent.enroll(&rental_text, 1, &first).await;
    assert_eq!(status, 200, "{resumed}");
    let second = resumed["session_token"].as_str().expect("a token").to_string();
    let operator = role_token(Role::Operator, None);
    let node_log = || async {
        let page = server
            .graphql(&operator, "{ events(first: 100, filter: { streamTypes: [\"node\"] }) { edges { node { type payload } } } }", json!({}))
            .await;
        data(&page)["events"]["edges"].as_array().expect("edges").clone()
    };
    let before = eventually("the resume in the log", || async {
        let edges = node_log().await;
        edges.iter().any(|e| e["node"]["payload"]["fencing_token"] == 2).then_some(edges)
    })
    .await;
    let (status, answer) = agent.events(&second, spool).await;
    assert_eq!((status, answer["skipped"].as_array().map(Vec::len)), (202, Some(1)), "{answer}");
    // The node refuses the first session's launch (a superseded token): that says nothing of
    // whether it applied it then, so it is not recorded as a refusal.
    let (status, body) = agent.result(&second, &launch_op, false).await;
    assert_eq!(status, 202, "{body}");
    // A result for an operation never ordered is the node's mistake: 400, not 401.
    let (status, body) = agent.result(&second, &Uuid::now_v7().to_string(), true).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("RESULT_REJECTED")), "{body}");
    assert_eq!(node_log().await, before, "neither the replay nor the refusal appended");
    // The second session's stream never carries the first session's launch: once the node's
    // reconciliation shows the launch applied and the tenant cancels, the first line on it is
    // the stop, ordered under the second session's token.
    let mut stream = agent.session(&second).await;
    let path = format!("/{}/reconciliation", node.0);
    let (status, body) =
        agent.post(&path, Some(&second), &json!({ "applied_operation_ids": [launch_op] })).await;
    assert_eq!(status, 202, "{body}");
    let cancel = "mutation($input: CancelRunInput!) { cancelRun(input: $input) { id } }";
    let cancelled = server
        .graphql(&acme, cancel, json!({ "input": { "runId": run, "operationKey": "c-1" } }))
        .await;
    data(&cancelled);
    let mut buffer = Vec::new();
    let stop = next_command(&mut stream, &mut buffer).await;
    assert_eq!(
        (stop["kind"].as_str(), stop["fencing_token"].as_u64()),
        (Some("stop_workload"), Some(2)),
        "{stop}"
    );
}

#[tokio::test]
async fn every_documented_node_agent_route_is_served_behind_its_credential() {
    let (server, _dir) = rented_server().await;
    let routes = leasehold_tests::documented_routes("POST /v1/node-agent");
    assert_eq!(routes.len(), 6, "{routes:?}");
    let agent =
        Agent { http: reqwest::Client::new(), base: server.base.clone(), node: Uuid::now_v7() };
    for route in routes {
        let path = route.replace("{node}", &agent.node.to_string());
        if route == "/enroll" {
            let (status, body) = agent.post(&path, None, &json!({ "node_id": "x" })).await;
            assert_eq!((status, body["code"].as_str()), (400, Some("INVALID_REQUEST")), "{body}");
            continue;
        }
        let (status, body) = agent.post(&path, None, &json!({})).await;
        assert_eq!((status, body["code"].as_str()), (401, Some("SESSION_REQUIRED")), "{route}");
        let (status, body) = agent.post(&path, Some("lhn1.forged"), &json!({})).await;
        assert_eq!((status, body["code"].as_str()), (401, Some("SESSION_REFUSED")), "{route}");
    }
}
