//! `lifecycleEvents` over WebSocket: order, resume, tenants, and the protocol's promises.

use leasehold_gateway::Role;
use serde_json::json;

use crate::socket::{Frame, LIFECYCLE, Socket};
use crate::support::*;

/// The lease kind's events only: a lease request also reserves on its tenant's lease quota,
/// whose events these tests of lease streams leave aside.
fn lease_kind() -> serde_json::Value {
    json!({ "streamTypes": ["lease"] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_requested_and_provisioned_arrives_in_order_and_reads_back() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    // The dashboard starts after an event it has already seen.
    let seen = request_lease(&server, &acme, "req-0").await;
    // Its leases' own events (each request also reserves on the tenant's lease quota).
    socket
        .subscribe("live", LIFECYCLE, json!({ "after": seen["cursor"], "filter": lease_kind() }))
        .await;

    let lease = request_lease(&server, &acme, "req-1").await;
    let input = report_input(&server, &lease["id"], "up-1").await;
    let reported = server.graphql(&role_token(Role::Agent, None), REPORT_PROVISIONED, input).await;
    assert!(reported.get("errors").is_none(), "{reported}");

    let mut seen = Vec::new();
    for _ in 0..3 {
        let event = socket.event("live").await;
        assert_eq!(event["streamId"], lease["streamId"]);
        assert!(event["tenantId"].is_null(), "tenants do not see tenant ids: {event}");
        seen.push((
            event["version"].as_u64().unwrap_or_default(),
            event["type"].as_str().unwrap_or_default().to_string(),
            event["cursor"].clone(),
        ));
    }
    let types: Vec<_> = seen.iter().map(|(version, kind, _)| (*version, kind.as_str())).collect();
    assert_eq!(
        types,
        [(1, "LeaseProvisionRequested"), (2, "LeaseProvisioned"), (3, "LeaseActivated")]
    );

    // The last event's cursor reads the lease back as ready, without sleeping.
    let last = seen[2].2.clone();
    let read = json!({
        "query": "{ leases { edges { node { id status } } } }",
        "extensions": { "minCursor": last },
    });
    let answer = server.graphql_with(&acme, read).await;
    let nodes = &data(&answer)["leases"]["edges"];
    let ready =
        nodes.as_array().into_iter().flatten().find(|edge| edge["node"]["id"] == lease["id"]);
    assert_eq!(ready.map(|edge| &edge["node"]["status"]), Some(&json!("READY")), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_events_never_arrive_and_its_cursor_is_refused() {
    let server = Server::start().await;
    let (acme, beta) = (tenant_token("acme"), tenant_token("beta"));
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &beta).await;
    let seen = request_lease(&server, &beta, "req-0").await;
    socket
        .subscribe("mine", LIFECYCLE, json!({ "after": seen["cursor"], "filter": lease_kind() }))
        .await;
    let acmes = request_lease(&server, &acme, "req-1").await;
    for n in 2..5 {
        request_lease(&server, &acme, &format!("req-{n}")).await;
    }
    let betas = request_lease(&server, &beta, "req-1").await;
    // The first event beta sees is its own, though acme's four came first.
    let event = socket.event("mine").await;
    assert_eq!(event["streamId"], betas["streamId"]);

    socket.subscribe("theirs", LIFECYCLE, json!({ "after": acmes["cursor"] })).await;
    let refused = socket.message().await;
    assert_eq!(
        (refused["type"].as_str(), refused["id"].as_str()),
        (Some("error"), Some("theirs")),
        "{refused}"
    );
    assert_eq!(refused["payload"][0]["extensions"]["code"], "BAD_USER_INPUT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_killed_mid_stream_resumes_exactly_once_while_writers_write() {
    let server = std::sync::Arc::new(Server::start().await);
    let acme = tenant_token("acme");
    const LEASES: usize = 60;
    // Everything after this lease's cursor is what the subscriber must see.
    let start = request_lease(&server, &acme, "first").await;
    let writer = {
        let (server, acme) = (server.clone(), acme.clone());
        tokio::spawn(async move {
            let mut last = json!(null);
            for n in 0..LEASES {
                last = request_lease(&server, &acme, &format!("req-{n}")).await;
            }
            last
        })
    };
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    socket
        .subscribe("s", LIFECYCLE, json!({ "after": start["cursor"], "filter": lease_kind() }))
        .await;
    let (mut streams, mut cursors) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let event = socket.event("s").await;
        streams.push(event["streamId"].clone());
        cursors.push(event["cursor"].clone());
    }
    // The socket dies mid-stream; a new one resumes from the last cursor while the writer
    // is still writing.
    drop(socket);
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    socket
        .subscribe("s", LIFECYCLE, json!({ "after": cursors.last(), "filter": lease_kind() }))
        .await;
    while streams.len() < LEASES {
        let event = socket.event("s").await;
        streams.push(event["streamId"].clone());
        cursors.push(event["cursor"].clone());
    }
    let last_written = writer.await.expect("the writer finishes");
    assert_eq!(streams.last(), Some(&last_written["streamId"]));
    // Exactly the log, in order: the same streams the `events` query lists after `first`.
    let page = "query($after: String, $filter: EventFilter) {
        events(after: $after, first: 100, filter: $filter) { edges { node { streamId } } } }";
    let variables = json!({ "after": start["cursor"], "filter": lease_kind() });
    let listed = server.graphql(&acme, page, variables).await;
    let listed: Vec<_> = data(&listed)["events"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|edge| edge["node"]["streamId"].clone())
        .collect();
    assert_eq!(listed, streams);
    let unique: std::collections::HashSet<_> = streams.iter().map(ToString::to_string).collect();
    assert_eq!(unique.len(), LEASES, "no duplicates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_closes_with_the_codes_clients_expect() {
    let server =
        Server::start_with(&["--ws-init-timeout-ms", "300", "--ws-ping-interval-ms", "200"]).await;
    let acme = tenant_token("acme");

    let mut silent = Socket::open(&server, "graphql-transport-ws").await;
    assert_eq!(silent.close_code().await, 4408);

    let mut eager = Socket::open(&server, "graphql-transport-ws").await;
    eager.subscribe("1", LIFECYCLE, json!({})).await;
    assert_eq!(eager.close_code().await, 4401);

    let mut forged = Socket::open(&server, "graphql-transport-ws").await;
    forged.init("not-a-token").await;
    assert_eq!(forged.close_code().await, 4403);

    let mut twice = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    twice.subscribe("1", LIFECYCLE, json!({})).await;
    twice.subscribe("1", LIFECYCLE, json!({})).await;
    assert_eq!(twice.close_code().await, 4409);

    // The server pings an idle socket, and a client ping gets a pong.
    let mut idle = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    assert_eq!(idle.frame().await, Frame::Message(json!({ "type": "ping" })));
    idle.send(json!({ "type": "ping" })).await;
    assert_eq!(idle.message().await, json!({ "type": "pong" }));

    // A token that expires closes its socket with 4403, so the client reconnects with a new one.
    let soon = secret().mint(&leasehold_gateway::Claims {
        sub: "acme-user".into(),
        role: Role::Tenant,
        tenant: Some("acme".into()),
        provider: None,
        all_providers: false,
        host: None,
        connection: None,
        runner_node: None,
        exp: chrono::Utc::now().timestamp() + 1,
        iat: chrono::Utc::now().timestamp(),
    });
    let mut expiring = Socket::connect(&server, "graphql-transport-ws", &soon).await;
    assert_eq!(expiring.close_code().await, 4403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_protocol_delivers_events_and_keep_alives() {
    let server = Server::start_with(&["--ws-ping-interval-ms", "200"]).await;
    let acme = tenant_token("acme");
    let mut socket = Socket::connect(&server, "graphql-ws", &acme).await;
    assert_eq!(socket.frame().await, Frame::Message(json!({ "type": "ka" })));
    let seen = request_lease(&server, &acme, "req-0").await;
    socket.subscribe("1", LIFECYCLE, json!({ "after": seen["cursor"] })).await;
    let lease = request_lease(&server, &acme, "req-1").await;
    let event = socket.event("1").await;
    assert_eq!(event["streamId"], lease["streamId"]);
    socket.send(json!({ "type": "stop", "id": "1" })).await;
    socket.send(json!({ "type": "connection_terminate" })).await;
    assert_eq!(socket.close_code().await, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_closes_sockets_with_1012() {
    let mut server = Server::start().await;
    let acme = tenant_token("acme");
    let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    socket.subscribe("1", LIFECYCLE, json!({})).await;
    let pid = server.child.id().expect("running");
    let killed =
        tokio::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
    assert!(killed.expect("kill runs").success());
    assert_eq!(socket.close_code().await, 1012);
    let status =
        tokio::time::timeout(std::time::Duration::from_secs(30), server.child.wait()).await;
    assert!(status.expect("exits in time").expect("waited").success());
}

/// Whether `/metrics` shows exactly `open` WebSockets.
async fn websockets_open(server: &Server, open: usize) -> bool {
    let (_, text) = server.get("/metrics").await;
    text.lines().any(|line| line == format!("leasehold_websockets_open {open}"))
}

/// A client that stops reading is given up on once a send to it has waited
/// `--ws-send-timeout-ms`, and the others are served all along.
///
/// How much a stuck client absorbs before a send blocks is not fixed: the kernel grows the
/// server's send buffer up to `net.ipv4.tcp_wmem`'s maximum (4 MiB here). A fixed amount of
/// traffic may fit, and then the server rightly never closes the socket (this test once
/// waited for that, and failed when the buffer grew). So the writer goes on until the server
/// has closed the stuck socket, as `/metrics` shows, and the reading socket must have every
/// event written by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_stops_reading_is_closed_and_does_not_stall_the_others() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use leasehold_commands::lease_input;

    /// Far more than any send buffer holds (8 KiB a lease): reaching it means no send ever
    /// blocked.
    const LEASES_MAX: usize = 3_000;
    let server = Server::start_with(&["--ws-send-timeout-ms", "1000"]).await;
    let operator = role_token(Role::Operator, None);
    request_lease(&server, &tenant_token("acme"), "req-0").await;
    // Operators see failure detail: 8 KiB per failure report.
    let operator_seen = {
        let page = "{ events(first: 1) { edges { cursor } } }";
        let answer = server.graphql_with(&operator, json!({ "query": page })).await;
        data(&answer)["events"]["edges"][0]["cursor"].clone()
    };
    let mut stuck = Socket::open_small(&server, "graphql-transport-ws").await;
    stuck.init(&operator).await;
    assert_eq!(stuck.message().await["type"], "connection_ack");
    stuck.subscribe("s", LIFECYCLE, json!({ "after": operator_seen })).await;
    let mut reader = Socket::connect(&server, "graphql-transport-ws", &operator).await;
    let only_leases = json!({ "after": operator_seen, "filter": lease_kind() });
    reader.subscribe("r", LIFECYCLE, only_leases).await;

    let stop = Arc::new(AtomicBool::new(false));
    let direct = DirectWriter::on(&server);
    let writing = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let detail = "x".repeat(8 * 1024);
            let mut leases = 0;
            while !stop.load(Ordering::SeqCst) && leases < LEASES_MAX {
                let lease = direct.request(&format!("slow-req-{leases}")).await;
                let operation = leasehold_domain::lease::OperationId(lease.0);
                let failed = lease_input::report_failed(operation, None, "it failed", &detail)
                    .expect("valid");
                direct.execute(lease, &format!("slow-fail-{leases}"), failed).await;
                leases += 1;
            }
            leases
        })
    };
    // The reading socket is read all along; once told how many events were written, it has
    // to have had each of them.
    let (written_tx, mut written_rx) = tokio::sync::watch::channel(None::<usize>);
    let reading = tokio::spawn(async move {
        let mut events = 0;
        loop {
            if *written_rx.borrow_and_update() == Some(events) {
                return events;
            }
            tokio::select! {
                event = reader.event("r") => {
                    assert_eq!(event["streamType"], "lease");
                    events += 1;
                }
                _ = written_rx.changed() => {}
            }
        }
    });
    // The server gives up on the stuck socket while the writer goes on.
    // /metrics is asked at most every 100 ms, so the polling does not load the server.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut poll = tokio::time::interval(std::time::Duration::from_millis(100));
    while !websockets_open(&server, 1).await {
        assert!(!writing.is_finished(), "{LEASES_MAX} leases written and the stuck socket is open");
        assert!(tokio::time::Instant::now() < deadline, "the stuck socket is still open");
        poll.tick().await;
    }
    stop.store(true, Ordering::SeqCst);
    let leases = writing.await.expect("the writer finishes");
    // Each lease: requested, then its provision failed and the pending lease was rejected.
    written_tx.send(Some(3 * leases)).expect("the reader waits");
    let read = tokio::time::timeout(std::time::Duration::from_secs(60), reading).await;
    assert_eq!(read.expect("every event reaches the reader").expect("it reads"), 3 * leases);
    // It was closed with 1013 when the closing frame still fitted, otherwise dropped (1006);
    // either way the client resumes from its last cursor.
    let code = stuck.close_code().await;
    assert!(matches!(code, 1013 | 1006), "closed with {code}");
}

/// A selection with an alias, a fragment, an inline fragment, `__typename` and an `@include`
/// on a variable: shared by every subscriber with the same scope.
const SHARED: &str = "subscription Live($after: String, $filter: EventFilter, $full: Boolean!) {
    feed: lifecycleEvents(after: $after, filter: $filter) {
        __typename at: cursor ...Where payload @include(if: $full)
        ... on LifecycleEvent { type version eventId tenantId metadata hash }
    }
}
fragment Where on LifecycleEvent { streamId streamType }";

/// The same selection with a directive on the root field: not shared, so async-graphql
/// executes it for its one subscriber, as every subscription was before.
const ALONE: &str = "subscription Live($after: String, $filter: EventFilter, $full: Boolean!) {
    feed: lifecycleEvents(after: $after, filter: $filter) @include(if: true) {
        __typename at: cursor ...Where payload @include(if: $full)
        ... on LifecycleEvent { type version eventId tenantId metadata hash }
    }
}
fragment Where on LifecycleEvent { streamId streamType }";

/// The cursor of the log's first event as `token` is given it, once the log's readers can
/// read it (another test's open transaction may hold them back for a while).
async fn first_cursor(server: &Server, token: &str) -> serde_json::Value {
    let first = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let page =
                server.graphql(token, "{ events(first: 1) { edges { cursor } } }", json!({})).await;
            let cursor = &data(&page)["events"]["edges"][0]["cursor"];
            if cursor.is_string() {
                return cursor.clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    first.await.expect("the first event is readable within 60 s")
}

/// The next `count` `next` payloads of operation `id`, whole.
async fn payloads(socket: &mut Socket, id: &str, count: usize) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let message = socket.message().await;
        assert_eq!((message["id"].as_str(), message["type"].as_str()), (Some(id), Some("next")));
        seen.push(message["payload"].clone());
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_rendering_is_what_each_subscriber_would_have_been_sent_alone() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let operator = role_token(Role::Operator, None);
    let start = request_lease(&server, &acme, "req-0").await;
    let variables = |full: bool| json!({ "after": start["cursor"], "full": full });
    // Three tenant subscribers share one rendering; a fourth asks without the payload (its
    // own); a fifth is executed alone; operators, another scope, likewise.
    let mut tenants = Vec::new();
    for (query, full) in
        [(SHARED, true), (SHARED, true), (SHARED, true), (SHARED, false), (ALONE, true)]
    {
        let mut socket = Socket::connect(&server, "graphql-transport-ws", &acme).await;
        socket.subscribe("1", query, variables(full)).await;
        tenants.push(socket);
    }
    // Operators' cursors are their own: both start after the log's first event.
    let after = first_cursor(&server, &operator).await;
    let mut operators = Vec::new();
    for query in [SHARED, ALONE] {
        let mut socket = Socket::connect(&server, "graphql-transport-ws", &operator).await;
        socket.subscribe("1", query, json!({ "after": after, "full": true })).await;
        operators.push(socket);
    }
    let lease = request_lease(&server, &acme, "req-1").await;
    let input = report_input(&server, &lease["id"], "up-1").await;
    let reported = server.graphql(&role_token(Role::Agent, None), REPORT_PROVISIONED, input).await;
    assert!(reported.get("errors").is_none(), "{reported}");
    // The request's lease and quota events, the report's two: at least 4 after the start.
    let count = 4;
    let mut seen = Vec::new();
    for socket in &mut tenants {
        seen.push(payloads(socket, "1", count).await);
    }
    let alone = &seen[4];
    assert_eq!(seen[0], *alone, "shared and alone differ");
    assert_eq!((&seen[1], &seen[2]), (alone, alone));
    for (with, without) in alone.iter().zip(&seen[3]) {
        let mut expected = with.clone();
        expected["data"]["feed"].as_object_mut().expect("an object").remove("payload");
        assert_eq!(*without, expected);
    }
    let first = &alone[0]["data"]["feed"];
    assert_eq!(first["__typename"], "LifecycleEvent");
    assert!(first["tenantId"].is_null() && first["hash"].is_null(), "tenant view: {first}");
    // Operators: shared or alone alike, with what only they see.
    let shared = payloads(&mut operators[0], "1", count).await;
    let alone = payloads(&mut operators[1], "1", count).await;
    assert_eq!(shared, alone);
    assert_eq!(shared[0]["data"]["feed"]["tenantId"], "acme");
    // Rendered once per event for the three sharers, not three times.
    let (_, metrics) = server.get("/metrics").await;
    let value = |name: &str| {
        let line = metrics.lines().find(|line| line.starts_with(&format!("{name} ")));
        line.and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok()).expect(name)
    };
    assert_eq!(value("leasehold_live_selections"), 3, "acme's two selections and the operators'");
    let (renders, deliveries) =
        (value("leasehold_live_renders_total"), value("leasehold_live_deliveries_total"));
    assert!(deliveries >= renders + 2 * count as u64, "{renders} renders, {deliveries} deliveries");
    // A refused subscription keeps nothing, and once the sockets close no selection is kept.
    let mut refused = Socket::connect(&server, "graphql-transport-ws", &acme).await;
    refused.subscribe("1", SHARED, json!({ "after": "not a cursor", "full": true })).await;
    assert_eq!(refused.message().await["type"], "error");
    drop((tenants, operators, refused));
    let emptied = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !server.get("/metrics").await.1.contains("\nleasehold_live_selections 0\n") {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    emptied.await.expect("no selection is kept once its sockets are gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_sending_one_document_share_nothing() {
    let server = Server::start().await;
    let (acme, beta) = (tenant_token("acme"), tenant_token("beta"));
    let mut sockets = Vec::new();
    for token in [&acme, &beta] {
        let start = request_lease(&server, token, "start").await;
        let mut socket = Socket::connect(&server, "graphql-transport-ws", token).await;
        socket
            .subscribe("1", LIFECYCLE, json!({ "after": start["cursor"], "filter": lease_kind() }))
            .await;
        sockets.push(socket);
    }
    let acmes = request_lease(&server, &acme, "req-1").await;
    let betas = request_lease(&server, &beta, "req-1").await;
    // Each sees its own lease, with a cursor sealed for it alone.
    let (seen_by_acme, seen_by_beta) = (sockets[0].event("1").await, sockets[1].event("1").await);
    assert_eq!(seen_by_acme["streamId"], acmes["streamId"]);
    assert_eq!(seen_by_beta["streamId"], betas["streamId"]);
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("\nleasehold_live_selections 2\n"),
        "one selection a tenant:\n{metrics}"
    );
    // Beta's cursor means nothing to acme.
    sockets[0].subscribe("2", LIFECYCLE, json!({ "after": seen_by_beta["cursor"] })).await;
    let refused = sockets[0].message().await;
    assert_eq!((refused["type"].as_str(), refused["id"].as_str()), (Some("error"), Some("2")));
}
