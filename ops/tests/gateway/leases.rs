//! A lease's life through the gateway: requests, reports, retries and reading one's writes.

use leasehold_gateway::Role;
use serde_json::json;

use crate::support::*;

const LEASE: &str =
    "query($id: ID!) { lease(id: $id) { id status chainState items { sku quantity } } }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reads_its_own_write_without_waiting() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let requested = request_lease(&server, &acme, "req-1").await;
    assert_eq!(requested["events"], json!([{ "type": "LeaseProvisionRequested" }]));
    assert_eq!(requested["version"], 1);
    let request = json!({
        "query": "{ leases(filter: { status: PROVISIONING }) { edges { node { id status items { sku quantity } } } } }",
        "extensions": { "minCursor": requested["cursor"] },
    });
    let answer = server.graphql_with(&acme, request).await;
    let edges = &data(&answer)["leases"]["edges"];
    assert_eq!(edges[0]["node"]["id"], requested["id"], "{answer}");
    assert_eq!(edges[0]["node"]["items"], json!([{ "sku": "gpu.h100.1x", "quantity": 1 }]));

    let agent = role_token(Role::Agent, None);
    let input = report_input(&server, &requested["id"], "up-1").await;
    let reported = server.graphql(&agent, REPORT_PROVISIONED, input).await;
    assert_eq!(data(&reported)["reportLeaseProvisioned"]["version"], 3);
    let usage = server
        .graphql(&acme, "{ quotaUsage { kind activeCount skus { sku quantity } } }", json!({}))
        .await;
    assert_eq!(
        data(&usage)["quotaUsage"],
        json!([{ "kind": "lease", "activeCount": 1, "skus": [{ "sku": "gpu.h100.1x", "quantity": 1 }] }])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_answers_the_first_result_and_a_changed_one_conflicts() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let first = request_lease(&server, &acme, "req-1").await;
    let again = request_lease(&server, &acme, "req-1").await;
    assert_eq!(again["duplicate"], true);
    assert_eq!(
        (&again["id"], &again["version"], &again["cursor"]),
        (&first["id"], &first["version"], &first["cursor"])
    );
    assert_eq!(again["events"], first["events"], "a retry answers what the first call did");

    let mut changed = lease_request("req-1");
    changed["input"]["items"][0]["quantity"] = json!(2);
    let answer = server.graphql(&acme, REQUEST_LEASE, changed).await;
    assert_eq!(code(&answer), Some("IDEMPOTENCY_CONFLICT"), "{answer}");
    // The same key from another tenant is that tenant's own.
    let beta = request_lease(&server, &tenant_token("beta"), "req-1").await;
    assert_eq!(beta["duplicate"], false);
    assert_ne!(beta["id"], first["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_its_field_and_appends_nothing() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let mut bad = lease_request("req-1");
    bad["input"]["items"][0]["quantity"] = json!(0);
    let answer = server.graphql(&acme, REQUEST_LEASE, bad).await;
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"));
    assert!(
        answer["errors"][0]["message"].as_str().unwrap_or_default().contains("items[0].quantity"),
        "{answer}"
    );
    let mut bad_key = lease_request("has space");
    bad_key["input"]["leaseId"] = json!("0190a5b6-0000-7000-8000-000000000001");
    assert_eq!(code(&server.graphql(&acme, REQUEST_LEASE, bad_key).await), Some("BAD_USER_INPUT"));
    let missing =
        server.graphql(&acme, LEASE, json!({ "id": "0190a5b6-0000-7000-8000-000000000001" })).await;
    assert_eq!(code(&missing), Some("NOT_FOUND"));
    let client = server.db.client().await;
    let count: i64 =
        client.query_one("SELECT count(*) FROM events", &[]).await.expect("counted").get(0);
    assert_eq!(count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_closes_a_lease_for_its_tenant() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let input = report_input(&server, &lease["id"], "up-1").await;
    server.graphql(&role_token(Role::Agent, None), REPORT_PROVISIONED, input).await;
    let close = "mutation($input: LeaseOperationInput!) { closeLease(input: $input) { id events { type } } }";
    let input = json!({ "input": { "leaseId": lease["id"], "operationKey": "close-1" } });
    let closed = server.graphql(&role_token(Role::Operator, None), close, input).await;
    assert!(data(&closed)["closeLease"]["events"][0]["type"].as_str().is_some(), "{closed}");
    let missing = json!({ "input": { "leaseId": "0190a5b6-0000-7000-8000-000000000001", "operationKey": "close-2" } });
    let answer = server.graphql(&role_token(Role::Operator, None), close, missing).await;
    assert_eq!(code(&answer), Some("NOT_FOUND"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_your_writes_query_answers_stale_when_the_projections_cannot_reach_it() {
    let server = Server::start_with(&["--consistency-wait-ms", "300"]).await;
    let acme = tenant_token("acme");
    // An open transaction holds back every reader of the log, the projector included.
    let holder = server.db.client().await;
    holder.batch_execute("BEGIN; SELECT pg_current_xact_id();").await.expect("a transaction");
    let lease = request_lease(&server, &acme, "req-1").await;
    let read = json!({ "query": "{ leases { edges { node { id } } } }", "extensions": { "minCursor": lease["cursor"] } });
    let stale = server.graphql_with(&acme, read.clone()).await;
    assert_eq!(code(&stale), Some("STALE"), "{stale}");
    // Once it ends, the same query answers as soon as the projector has caught up (which,
    // on a loaded machine, may take longer than one 300 ms wait: ask until it is not STALE).
    holder.batch_execute("COMMIT").await.expect("committed");
    let fresh = server.answered(&acme, read).await;
    assert_eq!(data(&fresh)["leases"]["edges"][0]["node"]["id"], lease["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_events_page_scans_in_proportion_to_what_it_asks_for() {
    let server = Server::start().await;
    let (acme, globex) = (tenant_token("acme"), tenant_token("globex"));
    let start = request_lease(&server, &acme, "req-0").await;
    // Another tenant's events (two a request: the lease's and its quota reservation), more
    // than one small page may scan and fewer than two, then the tenant's own.
    for n in 0..30 {
        request_lease(&server, &globex, &format!("other-{n}")).await;
    }
    let own = request_lease(&server, &acme, "req-1").await;
    let page = "query($after: String) { events(after: $after, first: 1) {
        edges { node { streamId } } pageInfo { hasNextPage endCursor } } }";
    let read = |after: serde_json::Value| json!({ "query": page, "variables": { "after": after }, "extensions": { "minCursor": own["cursor"] } });
    // The first page stops after 50 events of the log, having found none of the tenant's.
    let first = server.graphql_with(&acme, read(start["cursor"].clone())).await;
    let events = &data(&first)["events"];
    assert_eq!(events["edges"], json!([]), "{first}");
    assert_eq!(events["pageInfo"]["hasNextPage"], true);
    // Going on from endCursor finds the tenant's next event.
    let next = server.graphql_with(&acme, read(events["pageInfo"]["endCursor"].clone())).await;
    assert_eq!(data(&next)["events"]["edges"][0]["node"]["streamId"], own["streamId"], "{next}");
}

/// Takes projection `name`'s lock from its runner: ends the runner's session until the lock is
/// the test's (the runner waits and tries again while another session holds it).
async fn take_projection_lock(server: &Server, name: &str) -> tokio_postgres::Client {
    let holder = server.db.client().await;
    let taken = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let row = holder
                .query_one("SELECT pg_try_advisory_lock(19528, hashtext($1))", &[&name])
                .await
                .expect("tried");
            if row.get::<_, bool>(0) {
                return;
            }
            // Advisory locks are per database: only this server's runner is ended.
            holder
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
                     AND classid = 19528 AND objid = hashtext($1)::oid AND granted \
                     AND pid <> pg_backend_pid() \
                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                    &[&name],
                )
                .await
                .expect("terminated");
        }
    });
    taken.await.expect("the lock is taken in time");
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes_waits_only_for_the_projections_a_query_reads() {
    let server = Server::start_with(&["--consistency-wait-ms", "300"]).await;
    let acme = tenant_token("acme");
    // The lease projection cannot advance while the test holds its lock.
    let holder = take_projection_lock(&server, "lease_views").await;
    let lease = request_lease(&server, &acme, "req-1").await;
    let with_min =
        |query: &str| json!({ "query": query, "extensions": { "minCursor": lease["cursor"] } });
    // The log's own queries read no projection: they answer once the log's readers can see
    // the write (a transaction open elsewhere on the server may hold that back a moment).
    let events = server.answered(&acme, with_min("{ events(first: 1) { edges { cursor } } }"));
    let events = events.await;
    assert_eq!(data(&events)["events"]["edges"].as_array().map(Vec::len), Some(1), "{events}");
    // Queries of the lease read model, and of the tables every kind writes, wait for it.
    let leases = server.graphql_with(&acme, with_min("{ leases { edges { cursor } } }")).await;
    assert_eq!(code(&leases), Some("STALE"), "{leases}");
    let workloads =
        server.graphql_with(&acme, with_min("{ workloads { edges { cursor } } }")).await;
    assert_eq!(code(&workloads), Some("STALE"), "{workloads}");
    // Given its lock back, the projection catches up and the same query answers.
    drop(holder);
    let fresh = server.answered(&acme, with_min("{ leases { edges { cursor } } }")).await;
    assert_eq!(data(&fresh)["leases"]["edges"].as_array().map(Vec::len), Some(1), "{fresh}");
}

/// Rule 30: a lookup of up to 100 lease ids, validated and de-duplicated, answers the
/// tenant's own leases among them; another tenant's and unknown ones are simply absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_by_ids_answers_only_the_tenants_own_leases() {
    let server = Server::start().await;
    let (acme, other) = (tenant_token("acme"), tenant_token("globex"));
    let mine = request_lease(&server, &acme, "req-1").await;
    let theirs = request_lease(&server, &other, "req-1").await;
    let unknown = uuid::Uuid::now_v7().to_string();
    let lookup = "query($ids: [ID!]!) { leases(ids: $ids) { edges { node { id } } pageInfo { hasNextPage } } }";
    let ids = json!([mine["id"], theirs["id"], unknown, mine["id"]]);
    let request = json!({ "query": lookup, "variables": { "ids": ids }, "extensions": { "minCursor": mine["cursor"] } });
    let answer = server.graphql_with(&acme, request).await;
    let edges = &data(&answer)["leases"]["edges"];
    assert_eq!(edges, &json!([{ "node": { "id": mine["id"] } }]), "{answer}");
    assert_eq!(data(&answer)["leases"]["pageInfo"]["hasNextPage"], false);
    let too_many: Vec<String> = (0..101).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    let answer = server.graphql(&acme, lookup, json!({ "ids": too_many })).await;
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"), "{answer}");
    let answer = server.graphql(&acme, lookup, json!({ "ids": [mine["id"], "nope"] })).await;
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"));
    assert!(answer["errors"][0]["message"].as_str().unwrap().contains("ids[1]"), "{answer}");
    let answer = server.graphql(&acme, lookup, json!({ "ids": [] })).await;
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"));
}

/// A lease's releases, for its tenant only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reads_its_leases_releases() {
    let server = Server::start().await;
    let (acme, other) = (tenant_token("acme"), tenant_token("globex"));
    let lease = request_lease(&server, &acme, "req-1").await;
    let releases = "query($id: ID!) { leaseReleases(id: $id) { version status payloadHash } }";
    let request = json!({ "query": releases, "variables": { "id": lease["id"] }, "extensions": { "minCursor": lease["cursor"] } });
    let answer = server.graphql_with(&acme, request).await;
    let shown = &data(&answer)["leaseReleases"];
    assert_eq!(shown[0]["version"], 1, "{answer}");
    assert_eq!(shown[0]["status"], "deploying");
    assert_eq!(shown[0]["payloadHash"].as_str().map(str::len), Some(64));
    let answer = server.graphql(&other, releases, json!({ "id": lease["id"] })).await;
    assert_eq!(code(&answer), Some("NOT_FOUND"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_until_a_cursor_show_the_log_as_it_stood_then() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let leases: Vec<serde_json::Value> = [
        request_lease(&server, &acme, "req-1").await,
        request_lease(&server, &acme, "req-2").await,
        request_lease(&server, &acme, "req-3").await,
    ]
    .into();
    let page = "query($until: String) { events(first: 100, until: $until, filter: { streamTypes: [\"lease\"] }) {
        edges { node { streamId } } pageInfo { hasNextPage } } }";
    let read = |until: &serde_json::Value| json!({ "query": page, "variables": { "until": until }, "extensions": { "minCursor": leases[2]["cursor"] } });
    let answer = server.answered(&acme, read(&leases[1]["cursor"])).await;
    let events = &data(&answer)["events"];
    let streams: Vec<&str> = events["edges"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["node"]["streamId"].as_str())
        .collect();
    assert_eq!(
        streams,
        [leases[0]["streamId"].as_str().unwrap(), leases[1]["streamId"].as_str().unwrap()]
    );
    assert_eq!(events["pageInfo"]["hasNextPage"], false);
    // Another caller's cursor is refused, as an `after` is.
    let globex = tenant_token("globex");
    let foreign = server.graphql_with(&globex, read(&leases[1]["cursor"])).await;
    assert_eq!(code(&foreign), Some("BAD_USER_INPUT"));
}

/// The cursor of the last of the lease's events `token` may read, once at least `count` of
/// them are visible (the log's readers may lag a commit a moment; at most 60 s).
async fn last_cursor(
    server: &Server,
    token: &str,
    stream: &serde_json::Value,
    count: usize,
) -> serde_json::Value {
    let page = "query($id: String!) { events(first: 100, filter: { streamIds: [$id] }) { edges { node { cursor } } } }";
    let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let answer = server.graphql(token, page, json!({ "id": stream })).await;
            let edges = data(&answer)["events"]["edges"].as_array().cloned().unwrap_or_default();
            if edges.len() >= count {
                return edges.last().expect("an event")["node"]["cursor"].clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    found.await.expect("the events are visible in time")
}

/// Issue 15: `lease(id, asOf: c)` answers what `lease(id)` answered when the projection had
/// reached `c`, at every step of the lease's life, long after the lease has moved on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_as_of_a_cursor_is_the_lease_the_read_model_showed_then() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let agent = role_token(Role::Agent, None);
    let query = LEASE_AS_OF;
    let lease = request_lease(&server, &acme, "req-1").await;
    let mut seen = vec![lease_then(&server, &acme, &lease, 1).await];
    let input = report_input(&server, &lease["id"], "up-1").await;
    let reported = server.graphql(&agent, REPORT_PROVISIONED, input).await;
    let events = reported_version(&reported, "reportLeaseProvisioned");
    seen.push(lease_then(&server, &acme, &lease, events).await);
    let restart =
        "mutation($input: LeaseOperationInput!) { restartLease(input: $input) { version } }";
    let input = json!({ "input": { "leaseId": lease["id"], "operationKey": "restart-1" } });
    let restarted = server.graphql(&acme, restart, input).await;
    let events = reported_version(&restarted, "restartLease");
    seen.push(lease_then(&server, &acme, &lease, events).await);
    let down =
        "mutation($input: LeaseOperationInput!) { deprovisionLease(input: $input) { version } }";
    let input = json!({ "input": { "leaseId": lease["id"], "operationKey": "down-1" } });
    let released = server.graphql(&acme, down, input).await;
    let events = reported_version(&released, "deprovisionLease");
    seen.push(lease_then(&server, &acme, &lease, events).await);
    // Every past state, asked for by its cursor after the last step.
    for (cursor, then) in &seen {
        let variables = json!({ "id": lease["id"], "asOf": cursor });
        let answer = server.graphql(&acme, query, variables).await;
        assert_eq!(&data(&answer)["lease"], then, "as of {cursor}: {answer}");
    }
    assert_ne!(seen[0].1["status"], seen[3].1["status"], "the lease moved on: {seen:?}");
    // Another tenant, with a cursor of its own, finds no such lease then either.
    let globex = tenant_token("globex");
    let theirs = request_lease(&server, &globex, "req-1").await;
    let variables = json!({ "id": lease["id"], "asOf": theirs["cursor"] });
    let answer = server.graphql(&globex, query, variables).await;
    assert_eq!(code(&answer), Some("NOT_FOUND"), "{answer}");
    // A cursor sealed for another caller is refused, as `after` refuses it.
    let variables = json!({ "id": lease["id"], "asOf": theirs["cursor"] });
    let answer = server.graphql(&acme, query, variables).await;
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"), "{answer}");
}

const LEASE_AS_OF: &str = "query($id: ID!, $asOf: String) { lease(id: $id, asOf: $asOf) { id providerId status chainState reason message items { sku quantity } failCount createdAt updatedAt retainedUntil restoredFrom } }";

/// The cursor of the lease's `events`-th event and `lease(id)` read once the projection has
/// reached it.
async fn lease_then(
    server: &Server,
    token: &str,
    lease: &serde_json::Value,
    events: usize,
) -> (serde_json::Value, serde_json::Value) {
    let cursor = last_cursor(server, token, &lease["streamId"], events).await;
    let read = json!({ "query": LEASE_AS_OF, "variables": { "id": lease["id"] }, "extensions": { "minCursor": cursor } });
    let answer = server.answered(token, read).await;
    (cursor, data(&answer)["lease"].clone())
}

/// The stream version a mutation's answer reports, as an event count.
fn reported_version(answer: &serde_json::Value, field: &str) -> usize {
    let version = data(answer)[field]["version"].as_u64();
    usize::try_from(version.unwrap_or_else(|| panic!("{field}: {answer}"))).expect("small")
}
