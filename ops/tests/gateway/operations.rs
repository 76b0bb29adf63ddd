//! What operators and dashboards watch: workloads, projection progress and `/metrics`.

use leasehold_gateway::Role;
use serde_json::json;

use crate::socket::{LIFECYCLE, Socket};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_list_the_tenants_own_newest_first_in_pages() {
    let server = Server::start().await;
    let (acme, beta) = (tenant_token("acme"), tenant_token("beta"));
    let first = request_lease(&server, &acme, "req-1").await;
    let second = request_lease(&server, &acme, "req-2").await;
    request_lease(&server, &beta, "req-1").await;
    let page = "query($after: String) { workloads(first: 1, after: $after, filter: { kind: \"lease\" }) { edges { cursor node { id kind status backendName items { sku count serviceName } } } pageInfo { hasNextPage endCursor } } }";
    let read = json!({ "query": page, "variables": { "after": null }, "extensions": { "minCursor": second["cursor"] } });
    let one = server.graphql_with(&acme, read).await;
    let workloads = &data(&one)["workloads"];
    assert_eq!(workloads["edges"][0]["node"]["id"], second["id"]);
    assert_eq!(
        workloads["edges"][0]["node"]["items"],
        json!([{ "sku": "gpu.h100.1x", "count": 1, "serviceName": null }])
    );
    assert_eq!(workloads["edges"][0]["node"]["backendName"], "local");
    assert_eq!(workloads["pageInfo"]["hasNextPage"], true);
    let two =
        server.graphql(&acme, page, json!({ "after": workloads["pageInfo"]["endCursor"] })).await;
    let workloads = &data(&two)["workloads"];
    assert_eq!(workloads["edges"][0]["node"]["id"], first["id"]);
    assert_eq!(workloads["pageInfo"]["hasNextPage"], false);
    // A workloads cursor is not a leases cursor.
    let leases = "query($after: String) { leases(after: $after) { edges { cursor } } }";
    let crossed =
        server.graphql(&acme, leases, json!({ "after": workloads["edges"][0]["cursor"] })).await;
    assert_eq!(code(&crossed), Some("BAD_USER_INPUT"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_projection_progress_and_tenants_do_not() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    // Wait (bounded) for the projection to pass the lease, through read-your-writes.
    let read = json!({ "query": "{ quotaUsage { kind } }", "extensions": { "minCursor": lease["cursor"] } });
    data(&server.graphql_with(&acme, read).await);
    let query = "{ projections { name version cursor eventsApplied eventsBehind secondsBehind horizonLagSeconds } }";
    let answer = server.graphql(&role_token(Role::Operator, None), query, json!({})).await;
    let projections = data(&answer)["projections"].as_array().expect("a list");
    let names: Vec<&str> = projections.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"vm_views") && names.contains(&"host_views"), "{answer}");
    let leases = projections.iter().find(|p| p["name"] == "lease_views");
    let leases = leases.unwrap_or_else(|| panic!("no lease_views: {answer}"));
    // The lease's event and its quota reservation, committed together.
    assert_eq!(leases["eventsApplied"], 2);
    assert_eq!(leases["eventsBehind"], 0);
    let refused = server.graphql(&acme, query, json!({})).await;
    assert_eq!(code(&refused), Some("FORBIDDEN"));
    let auditor = server.graphql(&role_token(Role::Auditor, None), query, json!({})).await;
    assert_eq!(code(&auditor), Some("FORBIDDEN"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_sockets_and_lag() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let seen = request_lease(&server, &acme, "req-1").await;
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    socket.subscribe("1", LIFECYCLE, json!({ "after": seen["cursor"] })).await;
    // The subscription is running once an event reaches it.
    let lease = request_lease(&server, &acme, "req-2").await;
    assert_eq!(socket.event("1").await["streamId"], lease["streamId"]);
    // Once the projection has committed past it, it has a lag to report.
    let read = json!({ "query": "{ quotaUsage { kind } }", "extensions": { "minCursor": lease["cursor"] } });
    data(&server.graphql_with(&acme, read).await);
    let (status, text) = server.get("/metrics").await;
    assert_eq!(status, 200);
    for expected in [
        "leasehold_http_requests_total{route=\"/graphql\",status=\"200\"} 3",
        "leasehold_http_request_duration_seconds_count{route=\"/graphql\"} 3",
        "leasehold_http_requests_total{route=\"/graphql/ws\",status=\"101\"} 1",
        "leasehold_websockets_open 1",
        "leasehold_subscriptions_active 1",
        "leasehold_live_selections 1",
        "leasehold_projection_events_behind{projection=\"lease_views\"}",
        "leasehold_horizon_lag_seconds",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_scrape_never_reads_the_log() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let read = json!({ "query": "{ quotaUsage { kind } }", "extensions": { "minCursor": lease["cursor"] } });
    data(&server.graphql_with(&acme, read).await);
    // While nothing can read the log, a scrape still answers: it counts no events (a count
    // over a large backlog on every scrape would cost the database dearly).
    let mut holder = server.db.client().await;
    let lock = holder.transaction().await.expect("a transaction");
    lock.batch_execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE").await.expect("locked");
    let scrape = tokio::time::timeout(std::time::Duration::from_secs(30), server.get("/metrics"));
    let (status, text) = scrape.await.expect("the scrape answers while the log is locked");
    lock.rollback().await.expect("released");
    assert_eq!(status, 200);
    assert!(
        text.contains("leasehold_projection_events_behind{projection=\"lease_views\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("leasehold_projection_seconds_behind{projection=\"lease_views\"} 0"),
        "{text}"
    );
}

/// `projections`' entry for `name`, asked again (every 50 ms, at most 60 s) until `done`.
async fn projection_until(
    server: &Server,
    name: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let query = "{ projections { name state error errorPosition builds { buildNo state eventsApplied eventsTotal } } }";
    let operator = role_token(Role::Operator, None);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let answer = server.graphql(&operator, query, json!({})).await;
        let found = data(&answer)["projections"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["name"] == name).cloned());
        if let Some(found) = found.filter(|found| done(found)) {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} never got there: {answer}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_rebuild_a_projection_through_graphql_and_watch_it_switch_in() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let read = json!({ "query": "{ quotaUsage { kind } }", "extensions": { "minCursor": lease["cursor"] } });
    data(&server.graphql_with(&acme, read).await);

    let rebuild = "mutation($name: String!) { rebuildProjection(name: $name) }";
    let operator = role_token(Role::Operator, None);
    let refused = server.graphql(&acme, rebuild, json!({ "name": "lease_views" })).await;
    assert_eq!(code(&refused), Some("FORBIDDEN"));
    let unknown = server.graphql(&operator, rebuild, json!({ "name": "nothing" })).await;
    assert_eq!(code(&unknown), Some("BAD_USER_INPUT"));
    let started = server.graphql(&operator, rebuild, json!({ "name": "lease_views" })).await;
    assert_eq!(data(&started)["rebuildProjection"], true);

    let switched = projection_until(&server, "lease_views", |p| {
        p["builds"].as_array().is_some_and(|b| b.iter().any(|b| b["state"] == "active"))
    })
    .await;
    assert_eq!(switched["state"], "RUNNING", "{switched}");
    let builds: Vec<(i64, &str)> = switched["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["buildNo"].as_i64().unwrap(), b["state"].as_str().unwrap()))
        .collect();
    assert_eq!(builds, [(0, "retired"), (1, "active")]);
    // The tenant reads its lease from the new tables, and what it does next lands in them.
    let query = "query($id: ID!) { lease(id: $id) { id } }";
    let found = server.graphql(&acme, query, json!({ "id": lease["id"] })).await;
    assert_eq!(data(&found)["lease"]["id"], lease["id"]);
    let next = request_lease(&server, &acme, "req-2").await;
    let read = json!({ "query": query, "variables": { "id": next["id"] }, "extensions": { "minCursor": next["cursor"] } });
    assert_eq!(data(&server.graphql_with(&acme, read).await)["lease"]["id"], next["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_that_cannot_apply_an_event_shows_failed_at_its_position() {
    use leasehold_domain::{EventStore as _, ExpectedVersion, StreamAppend};
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    // An event of the lease kind no code of this version reads, on the lease's stream.
    let stream = leasehold_domain::StreamId::parse(lease["streamId"].as_str().unwrap()).unwrap();
    let event = leasehold_domain::NewEvent {
        event_id: leasehold_domain::EventId::from_uuid(uuid::Uuid::now_v7()),
        event_type: leasehold_domain::EventType::parse("LeaseTeleported").unwrap(),
        schema_version: 1,
        payload: json!({ "to": "the moon" }),
        metadata: leasehold_domain::Metadata::default(),
    };
    let appended = server
        .db
        .store()
        .append(vec![StreamAppend {
            stream_id: stream,
            stream_type: leasehold_domain::StreamType::parse("lease").unwrap(),
            tenant_id: leasehold_domain::TenantId::parse("acme").unwrap(),
            expected: ExpectedVersion::Any,
            events: vec![event],
        }])
        .await
        .unwrap();
    let failed = projection_until(&server, "lease_views", |p| p["state"] == "FAILED").await;
    assert_eq!(failed["errorPosition"], appended.cursor.position, "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("LeaseTeleported"), "{failed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_rebuilds_a_projection_whose_tables_another_version_built() {
    let mut server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let read = json!({ "query": "{ quotaUsage { kind } }", "extensions": { "minCursor": lease["cursor"] } });
    data(&server.graphql_with(&acme, read).await);
    server.terminate().await;
    // As if an older binary had built the lease tables.
    let client = server.db.client().await;
    let sql = "UPDATE projection_checkpoints SET version = 0 WHERE projection = 'lease_views'";
    assert_eq!(client.execute(sql, &[]).await.unwrap(), 1);

    server.restart_with(&[]).await;
    let rebuilt = projection_until(&server, "lease_views", |p| {
        p["builds"].as_array().is_some_and(|b| b.iter().any(|b| b["state"] == "active"))
    })
    .await;
    assert_eq!(rebuilt["state"], "RUNNING", "{rebuilt}");
    let query = "query($id: ID!) { lease(id: $id) { id } }";
    let found = server.graphql(&acme, query, json!({ "id": lease["id"] })).await;
    assert_eq!(data(&found)["lease"]["id"], lease["id"]);
    let version: i32 = client
        .query_one(
            "SELECT version FROM projection_checkpoints WHERE projection = 'lease_views'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(version > 0, "the checkpoint is the rebuilt version's: {version}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_shows_in_projections_and_metrics_with_its_lag_and_failures() {
    use leasehold_adapters::relay::{KafkaRelay, RelayConfig, relay_checkpoints};
    let server = Server::start().await;
    let acme = tenant_token("acme");
    request_lease(&server, &acme, "req-1").await;
    let broker = leasehold_tests::kafka::Broker::start().await;
    broker.create_topic("leasehold.events", 1).await;
    let store = server.db.store();
    let head = server.db.settled_head().await;
    let relay =
        KafkaRelay::new(store.clone(), RelayConfig::new(&broker.address, "leasehold.events"));
    let relay = relay.expect("a relay");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the relay stops cleanly");
    });
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let checkpoints = relay_checkpoints(&store, None).await.expect("checkpoints");
        if checkpoints.first().is_some_and(|c| c.cursor >= head) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the relay did not catch up");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stop.send(()).expect("the relay runs");
    running.await.expect("stopped");

    let query = "{ projections { name kind eventsApplied eventsBehind state } }";
    let answer = server.graphql(&role_token(Role::Operator, None), query, json!({})).await;
    let relays: Vec<serde_json::Value> = data(&answer)["projections"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|p| p["kind"] == "RELAY")
        .cloned()
        .collect();
    assert_eq!(relays.len(), 1, "{answer}");
    assert_eq!(relays[0]["name"], "kafka:leasehold.events");
    assert_eq!(relays[0]["eventsBehind"], 0);
    assert_eq!(relays[0]["state"], "RUNNING");
    assert!(relays[0]["eventsApplied"].as_u64().expect("a count") >= 1, "{answer}");

    // A lease more, not relayed: the relay's lag counts it.
    request_lease(&server, &acme, "req-2").await;
    let (_, metrics) = server.get("/metrics").await;
    for expected in [
        "leasehold_relay_publish_errors_total{relay=\"kafka:leasehold.events\"} 0",
        "leasehold_projection_events_behind{projection=\"kafka:leasehold.events\"}",
    ] {
        assert!(metrics.contains(expected), "{expected} missing from:\n{metrics}");
    }
    let behind = metrics
        .lines()
        .find(|l| l.starts_with("leasehold_projection_events_behind{projection=\"kafka:"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(behind.is_some_and(|n| n >= 1), "{metrics}");
}
