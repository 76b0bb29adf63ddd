//! Rented capacity through a real `leasehold serve` started with a providers file: a tenant
//! rents, stops, resumes and terminates capacity and submits runs; the provider connection's
//! agent reports on its rentals with a token bound to its connection; operators read every
//! tenant's; and no tenant reaches another's rental, node or run by id, in lists, in
//! `workloads`, in the log or on a subscription.

use chrono::TimeDelta;
use leasehold_domain::rental::ConnectionId;
use leasehold_gateway::Role;
use serde_json::{Value, json};

use crate::backend::eventually;
use crate::socket::{LIFECYCLE, Socket};
use crate::support::*;

const PROVISION: &str = "mutation($input: ProvisionRentalInput!) { provisionRental(input: $input) { id version cursor events { type } } }";
const RENTAL: &str = "query($id: ID!) { rental(id: $id) { id tenantId connectionId offerId state generation nodeId nodeState nodeLeaseExpires factsAgeSeconds resources interruptibleRequested interruptibleAllocated price maxLifetimeSeconds observedState stateSince observedAt receivedAt queuedRuns } }";
const RECEIPT: &str = "mutation($input: RentalReceiptInput!) { reportRentalReceipt(input: $input) { id version cursor } }";
const OBSERVE: &str = "mutation($input: RentalObservationInput!) { reportRentalObservation(input: $input) { id version cursor } }";
pub(crate) const SUBMIT: &str =
    "mutation($input: SubmitRunInput!) { submitRun(input: $input) { id version cursor } }";
pub(crate) const RUN: &str = "query($id: ID!) { run(id: $id) { id rentalId status attemptsCount: attempts cancelRequested outcome } }";

const CAPABILITIES: &str = r#"{"stop": true, "resume": true, "persistent_disk": true,
    "spot": false, "exact_pricing": true, "idempotent_provision": "operation_key",
    "list_owned": true, "observe_after_terminate": false}"#;

/// The enrollment key the rented test servers derive enrollment tokens from.
pub(crate) const ENROLLMENT_KEY: &str = "an-enrollment-key-of-at-least-32-bytes-for-tests";

/// A server renting through the connection `sim`, and the directory of its providers file.
pub(crate) async fn rented_server() -> (Server, TempDir) {
    rented_server_logging("warn").await
}

/// [`rented_server`] logging at `level`.
pub(crate) async fn rented_server_logging(level: &str) -> (Server, TempDir) {
    let dir = TempDir(std::env::temp_dir().join(format!("lh-rent-{}", uuid::Uuid::now_v7())));
    std::fs::create_dir_all(&dir.0).expect("a directory");
    std::fs::write(dir.0.join("sim.token"), "sim-provider-token-0123456789abcdef0123")
        .expect("written");
    let file = dir.0.join("providers.json");
    let text = format!(
        r#"{{"providers": [{{"connection": "sim", "url": "http://127.0.0.1:9",
            "token_file": "sim.token", "capabilities": {CAPABILITIES}}}]}}"#
    );
    std::fs::write(&file, text).expect("written");
    let key = dir.0.join("enrollment.key");
    std::fs::write(&key, ENROLLMENT_KEY).expect("written");
    let key = key.to_str().expect("UTF-8");
    let file = file.to_str().expect("UTF-8");
    let server =
        Server::start_logging(&["--providers-file", file, "--enrollment-key-file", key], level)
            .await;
    (server, dir)
}

pub(crate) fn provider_agent(connection: &str) -> String {
    let connection = ConnectionId::parse("connection", connection).expect("valid");
    secret().mint_connection_agent("sim-agent", &connection, TimeDelta::hours(1))
}

fn provision_input(key: &str) -> Value {
    json!({ "input": {
        "operationKey": key, "connectionId": "sim", "offerId": "gpu-1x",
        "resources": { "cpuMillis": 4000, "memoryMb": 16384, "diskGb": 100, "gpus": 1 },
        "maxLifetimeSeconds": 86400,
    }})
}

/// `key`'s rental of `token`'s, accepted and observed active by its provider's agent.
pub(crate) async fn active_rental(server: &Server, token: &str, key: &str) -> Value {
    let provisioned = server.graphql(token, PROVISION, provision_input(key)).await;
    let rental = data(&provisioned)["provisionRental"]["id"].clone();
    let agent = provider_agent("sim");
    let receipt = json!({ "input": {
        "rentalId": rental, "generation": 1, "operationKey": format!("{key}-accept"),
        "nativeRef": "m-1", "state": "requested", "acceptedAt": "2026-12-03T09:00:00Z",
        "duplicate": false, "interruptible": false,
        "pricing": { "currency": "USD", "microsPerHour": 900000, "exact": true },
    }});
    data(&server.graphql(&agent, RECEIPT, receipt).await);
    let look = json!({ "input": {
        "rentalId": rental, "generation": 1, "operationKey": format!("{key}-active"),
        "nativeRef": "m-1", "state": "active", "stateSince": "2026-12-03T09:01:00Z",
        "observedAt": "2026-12-03T09:01:30Z",
    }});
    data(&server.graphql(&agent, OBSERVE, look).await);
    // The agent's cursor is sealed to the agent: the tenant waits for the projection.
    eventually(&format!("rental {rental} read active"), || async {
        let read = server.graphql(token, RENTAL, json!({ "id": rental })).await;
        (read["data"]["rental"]["state"] == "active").then_some(())
    })
    .await;
    rental
}

/// `query` read once the projections reached `cursor`.
pub(crate) async fn read_at(
    server: &Server,
    token: &str,
    (query, variables): (&str, Value),
    cursor: &Value,
) -> Value {
    server
        .graphql_with(
            token,
            json!({ "query": query, "variables": variables, "extensions": { "minCursor": cursor } }),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_rents_capacity_its_provider_reports_and_operators_see_it() {
    let (server, _dir) = rented_server().await;
    let acme = tenant_token("acme");
    let provisioned = server.graphql(&acme, PROVISION, provision_input("r-1")).await;
    let provisioned = data(&provisioned)["provisionRental"].clone();
    assert_eq!(provisioned["events"], json!([{ "type": "CapacityRequested" }]), "{provisioned}");
    let again = server.graphql(&acme, PROVISION, provision_input("r-1")).await;
    assert_eq!(data(&again)["provisionRental"]["id"], provisioned["id"], "a retry is the same");
    let rental = active_rental(&server, &acme, "r-1").await;
    assert_eq!(rental, provisioned["id"]);
    let read = server.graphql(&acme, RENTAL, json!({ "id": rental })).await;
    let read = data(&read)["rental"].clone();
    assert_eq!(read["tenantId"], Value::Null, "a tenant is not shown its own id: {read}");
    assert_eq!(
        (read["generation"].as_u64(), read["nodeState"].as_str()),
        (Some(1), Some("enrolling"))
    );
    assert_eq!(read["observedState"], "active");
    assert_eq!(read["stateSince"], "2026-12-03T09:01:00+00:00", "the provider's clock, as sent");
    assert_ne!(read["receivedAt"], read["observedAt"], "Leasehold stamps its own receipt");
    assert_eq!(read["price"]["micros_per_hour"], 900_000);
    assert_eq!(read["resources"]["gpus"], 1);
    // Nothing secret in what the tenant is shown.
    assert!(!read.to_string().contains("m-1"), "the provider's own name stays hidden: {read}");
    // An operator reads it with its tenant; a provider agent cannot read rentals at all.
    let operator = role_token(Role::Operator, None);
    let seen = server.graphql(&operator, RENTAL, json!({ "id": rental })).await;
    assert_eq!(data(&seen)["rental"]["tenantId"], "acme");
    let agent = server.graphql(&provider_agent("sim"), RENTAL, json!({ "id": rental })).await;
    assert_eq!(code(&agent), Some("FORBIDDEN"), "{agent}");
    // A stop under an old generation is fenced; under the current one it is taken.
    let stale = json!({ "input": { "rentalId": rental, "generation": 0, "operationKey": "s-0" } });
    let stop = "mutation($input: RentalGenerationInput!) { stopRental(input: $input) { events { type } } }";
    let fenced = server.graphql(&acme, stop, stale).await;
    assert_eq!(code(&fenced), Some("FENCED"), "{fenced}");
    let current =
        json!({ "input": { "rentalId": rental, "generation": 1, "operationKey": "s-1" } });
    let stopped = server.graphql(&acme, stop, current).await;
    assert_eq!(
        data(&stopped)["stopRental"]["events"],
        json!([{ "type": "CapacityStopRequested" }])
    );
    // Its node is listed, with no token of any kind.
    let nodes = server
        .graphql(&acme, "query($id: ID!) { rentalNodes(rentalId: $id) { id generation state pendingOperations } }", json!({ "id": rental }))
        .await;
    assert_eq!(data(&nodes)["rentalNodes"][0]["generation"], 1, "{nodes}");
    // An agent of another connection reaches none of sim's rentals, and none reaches leases.
    let other = json!({ "input": {
        "rentalId": rental, "generation": 1, "operationKey": "o-1", "nativeRef": "m-1",
        "state": "terminated", "observedAt": "2026-12-03T09:05:00Z",
    }});
    let foreign = server.graphql(&provider_agent("other"), OBSERVE, other).await;
    assert_eq!(code(&foreign), Some("NOT_FOUND"), "{foreign}");
    let leases = server
        .graphql(
            &provider_agent("sim"),
            "{ leaseWork(id: \"00000000-0000-0000-0000-000000000001\") { admittedAt } }",
            json!({}),
        )
        .await;
    assert_eq!(code(&leases), Some("FORBIDDEN"), "{leases}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_connection_or_a_bad_input_is_refused_naming_the_field() {
    let (server, _dir) = rented_server().await;
    let acme = tenant_token("acme");
    let mut input = provision_input("r-1");
    input["input"]["connectionId"] = json!("nowhere");
    let refused = server.graphql(&acme, PROVISION, input).await;
    assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    assert!(refused.to_string().contains("connection"), "{refused}");
    let mut input = provision_input("r-2");
    input["input"]["maxLifetimeSeconds"] = json!(1);
    let refused = server.graphql(&acme, PROVISION, input).await;
    assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
    let agent = provider_agent("sim");
    let bad = json!({ "input": {
        "rentalId": "00000000-0000-0000-0000-000000000001", "generation": 1,
        "operationKey": "o-1", "nativeRef": "m-1", "state": "exploded",
        "observedAt": "2026-12-03T09:05:00Z",
    }});
    let refused = server.graphql(&agent, OBSERVE, bad).await;
    assert_eq!(code(&refused), Some("BAD_USER_INPUT"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_rental_node_and_run_are_absent_everywhere() {
    let (server, _dir) = rented_server().await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    // globex watches the rented kinds' events from now on, before acme does anything.
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &globex).await;
    let filter = json!({ "streamTypes": ["rental", "node", "run"] });
    socket.subscribe("rented", LIFECYCLE, json!({ "filter": filter })).await;
    let rental = active_rental(&server, &acme, "r-1").await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "a".repeat(64)), "maxRuntimeSeconds": 3600,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit.clone()).await;
    let run = data(&submitted)["submitRun"].clone();
    let own = read_at(&server, &acme, (RUN, json!({ "id": run["id"] })), &run["cursor"]).await;
    assert_eq!(data(&own)["run"]["status"], "booked", "{own}");
    let node =
        data(&server.graphql(&acme, RENTAL, json!({ "id": rental })).await)["rental"]["nodeId"]
            .clone();
    // By id: not found.
    for (query, id) in [(RENTAL, &rental), (RUN, &run["id"])] {
        let theirs = server.graphql(&globex, query, json!({ "id": id })).await;
        assert_eq!(code(&theirs), Some("NOT_FOUND"), "{theirs}");
    }
    let nodes = server
        .graphql(
            &globex,
            "query($id: ID!) { rentalNodes(rentalId: $id) { id } }",
            json!({ "id": rental }),
        )
        .await;
    assert_eq!(code(&nodes), Some("NOT_FOUND"), "{nodes}");
    // Commands on them: not found; a run on acme's rental cannot be submitted by globex.
    let stop = "mutation($input: RentalGenerationInput!) { stopRental(input: $input) { id } }";
    let theirs = json!({ "input": { "rentalId": rental, "generation": 1, "operationKey": "s-1" } });
    assert_eq!(code(&server.graphql(&globex, stop, theirs).await), Some("NOT_FOUND"));
    let cancel = "mutation($input: CancelRunInput!) { cancelRun(input: $input) { id } }";
    let theirs = json!({ "input": { "runId": run["id"], "operationKey": "c-1" } });
    assert_eq!(code(&server.graphql(&globex, cancel, theirs).await), Some("NOT_FOUND"));
    assert_eq!(code(&server.graphql(&globex, SUBMIT, submit).await), Some("NOT_FOUND"));
    // In lists, workloads and the log: nothing.
    let lists = server
        .graphql(
            &globex,
            "{ rentals { edges { node { id } } } runs { edges { node { id } } } workloads { edges { node { id kind } } } events(first: 100) { edges { node { streamId } } } }",
            json!({}),
        )
        .await;
    let lists = data(&lists).clone();
    for field in ["rentals", "runs", "workloads", "events"] {
        assert_eq!(lists[field]["edges"], json!([]), "{field}: {lists}");
    }
    // acme's own lists hold them, workloads both kinds.
    let mine = server
        .graphql(
            &acme,
            "{ rentals { edges { node { id } } } workloads { edges { node { id kind } } } }",
            json!({}),
        )
        .await;
    let kinds: Vec<Value> = data(&mine)["workloads"]["edges"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|edge| edge["node"]["kind"].clone())
        .collect();
    assert!(kinds.contains(&json!("rental")) && kinds.contains(&json!("run")), "{mine}");
    // On the subscription: globex's first event is its own rental's, none of acme's before,
    // nor its own lease's (another stream type than the filter's).
    let lease = request_lease(&server, &globex, "lease-1").await;
    assert_eq!(lease["events"], json!([{ "type": "LeaseProvisionRequested" }]), "{lease}");
    let own = server.graphql(&globex, PROVISION, provision_input("g-1")).await;
    let own = data(&own)["provisionRental"]["id"].as_str().expect("an id").to_string();
    let first = socket.event("rented").await;
    assert_eq!(first["streamId"], format!("rental-{own}"), "{first}");
    let leaked = first.to_string();
    for id in [&rental, &run["id"], &node] {
        assert!(!leaked.contains(id.as_str().expect("an id")), "{leaked}");
    }
}

/// Issue 15: a rental as of a cursor is read beside its node as of the same cursor (the
/// query joins the node's row: both are folded up to there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rental_as_of_a_cursor_shows_it_and_its_node_as_they_were_then() {
    let (server, _dir) = rented_server().await;
    let acme = tenant_token("acme");
    let rental = active_rental(&server, &acme, "r-1").await;
    let events =
        server.graphql(&acme, "{ events(first: 100) { edges { cursor } } }", json!({})).await;
    let edges = data(&events)["events"]["edges"].as_array().cloned().unwrap_or_default();
    let then_at = edges.last().expect("the rental's events")["cursor"].clone();
    let query = "query($id: ID!, $asOf: String) { rental(id: $id, asOf: $asOf) { id state observedState generation nodeState stateSince createdAt updatedAt } }";
    let then = read_at(&server, &acme, (query, json!({ "id": rental })), &then_at).await;
    assert_eq!(data(&then)["rental"]["nodeState"], "enrolling", "{then}");
    let stop = "mutation($input: RentalGenerationInput!) { stopRental(input: $input) { cursor } }";
    let input = json!({ "input": { "rentalId": rental, "generation": 1, "operationKey": "s-1" } });
    let stopped = server.graphql(&acme, stop, input).await;
    let now = read_at(
        &server,
        &acme,
        (query, json!({ "id": rental })),
        &data(&stopped)["stopRental"]["cursor"],
    )
    .await;
    assert_ne!(data(&now)["rental"], data(&then)["rental"], "the rental moved on: {now}");
    let past = server.graphql(&acme, query, json!({ "id": rental, "asOf": then_at })).await;
    assert_eq!(data(&past)["rental"], data(&then)["rental"], "{past}");
}

/// Issue 15: a run as of a cursor, beside its rental's booking and its node as of the same
/// cursor; another tenant's run is not found then either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_as_of_a_cursor_is_the_run_as_it_was_then() {
    let (server, _dir) = rented_server().await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let rental = active_rental(&server, &acme, "r-1").await;
    let submit = json!({ "input": {
        "operationKey": "run-1", "rentalId": rental,
        "manifestDigest": format!("sha256:{}", "a".repeat(64)), "maxRuntimeSeconds": 3600,
    }});
    let submitted = server.graphql(&acme, SUBMIT, submit).await;
    let run = data(&submitted)["submitRun"].clone();
    let query = "query($id: ID!, $asOf: String) { run(id: $id, asOf: $asOf) { id rentalId bookingState status cancelRequested outcome nodeState createdAt updatedAt } }";
    let then = read_at(&server, &acme, (query, json!({ "id": run["id"] })), &run["cursor"]).await;
    assert_eq!(data(&then)["run"]["status"], "booked", "{then}");
    let cancel = "mutation($input: CancelRunInput!) { cancelRun(input: $input) { cursor } }";
    let input = json!({ "input": { "runId": run["id"], "operationKey": "c-1" } });
    let cancelled = server.graphql(&acme, cancel, input).await;
    let at = &data(&cancelled)["cancelRun"]["cursor"];
    let now = read_at(&server, &acme, (query, json!({ "id": run["id"] })), at).await;
    assert_ne!(data(&now)["run"], data(&then)["run"], "the run moved on: {now}");
    let past =
        server.graphql(&acme, query, json!({ "id": run["id"], "asOf": run["cursor"] })).await;
    assert_eq!(data(&past)["run"], data(&then)["run"], "{past}");
    // globex, with a cursor of its own, finds no such run then.
    let theirs = active_rental(&server, &globex, "r-1").await;
    let events =
        server.graphql(&globex, "{ events(first: 1) { edges { cursor } } }", json!({})).await;
    let own_cursor = data(&events)["events"]["edges"][0]["cursor"].clone();
    assert_ne!(theirs, rental);
    let foreign =
        server.graphql(&globex, query, json!({ "id": run["id"], "asOf": own_cursor })).await;
    assert_eq!(code(&foreign), Some("NOT_FOUND"), "{foreign}");
}
