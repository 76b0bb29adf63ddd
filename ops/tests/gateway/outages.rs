//! The database's sessions ended under load (`pg_terminate_backend`, as a failover or an
//! administrator does): every mutation is answered with its result or with the retryable
//! `UNAVAILABLE`, never `INTERNAL` or a wrong answer; retried with its operation key, each
//! lands once; the server reconnects by itself and its projections resume from their
//! checkpoints. (A restart of PostgreSQL itself would end every other test's sessions too: it
//! runs in the chaos suite, RELIABILITY.md.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// Clients writing at once, and the leases each requests.
const CLIENTS: usize = 4;
const LEASES_EACH: usize = 10;

/// How long one request may go on being answered `UNAVAILABLE` before the test gives up (a
/// time, not a count: on a loaded machine a slow request meets more of the ends).
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// Ends every session of the server's database, again and again, until `stop`; how many.
async fn terminate_until(client: tokio_postgres::Client, stop: Arc<AtomicBool>) -> i64 {
    let mut ended = 0;
    while !stop.load(Ordering::Relaxed) {
        let row = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("terminated");
        ended += row.get::<_, i64>(0);
        // Paced, so that the server gets work done between the ends.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    ended
}

/// Requests lease `key` until it is answered with its result (at most [`ANSWER_WAIT`]); how
/// many `UNAVAILABLE`s came first. Any other error fails the test.
async fn request_until_answered(server: &Server, token: &str, key: &str) -> (Value, usize) {
    let mut unavailable = 0;
    let answered = tokio::time::timeout(ANSWER_WAIT, async {
        loop {
            let answer = server.graphql(token, REQUEST_LEASE, lease_request(key)).await;
            match code(&answer) {
                None => return data(&answer)["requestLease"].clone(),
                Some("UNAVAILABLE") => unavailable += 1,
                Some(_) => {
                    let logged: Vec<_> = server
                        .logs()
                        .lines()
                        .filter(|l| l.contains("ERROR"))
                        .map(str::to_owned)
                        .collect();
                    panic!(
                        "a retryable code or the result, not: {answer}\nserver errors: {logged:#?}"
                    );
                }
            }
        }
    });
    let lease = answered.await.unwrap_or_else(|_| panic!("{key} answered within {ANSWER_WAIT:?}"));
    (lease, unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_ended_under_load_answer_unavailable_and_nothing_acknowledged_is_lost() {
    let server = Arc::new(Server::start().await);
    let acme = tenant_token("acme");
    let stop = Arc::new(AtomicBool::new(false));
    let terminator = tokio::spawn(terminate_until(server.db.client().await, stop.clone()));
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (server, acme) = (server.clone(), acme.clone());
        clients.push(tokio::spawn(async move {
            let mut answered = Vec::new();
            for n in 0..LEASES_EACH {
                answered
                    .push(request_until_answered(&server, &acme, &format!("c{client}-{n}")).await);
            }
            answered
        }));
    }
    let mut leases = Vec::new();
    for client in clients {
        leases.extend(client.await.expect("a client ran"));
    }
    stop.store(true, Ordering::Relaxed);
    let ended = terminator.await.expect("the terminator ran");
    let unavailable: usize = leases.iter().map(|(_, unavailable)| unavailable).sum();
    eprintln!("{ended} sessions ended; {unavailable} answers UNAVAILABLE, each retried");
    // Each acknowledged lease is in the log once.
    let observer = server.db.client().await;
    for (lease, _) in &leases {
        let stream = lease["streamId"].as_str().expect("a stream");
        let row = observer
            .query_one(
                "SELECT count(*) FROM events WHERE stream_id = $1 \
                 AND event_type = 'LeaseProvisionRequested'",
                &[&stream],
            )
            .await
            .expect("counted");
        assert_eq!(row.get::<_, i64>(0), 1, "{stream}");
    }
    // The projections resumed: the last lease reads back through its cursor.
    let (last, _) = leases.last().expect("leases");
    let query = "query($id: ID!) { lease(id: $id) { id } }";
    let found =
        server.graphql_after(&acme, query, json!({ "id": last["id"] }), &last["cursor"]).await;
    assert_eq!(data(&found)["lease"]["id"], last["id"]);
    let (status, _) = server.get("/readyz").await;
    assert_eq!(status, 200);
}

/// `/readyz`'s status, asked until it is `status` (at most 30 s).
async fn until_ready_is(server: &Server, status: u16) {
    let reached = tokio::time::timeout(Duration::from_secs(30), async {
        while server.get("/readyz").await.0 != status {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    reached.await.unwrap_or_else(|_| panic!("/readyz answers {status} in time"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_refuses_connections_is_not_ready_and_unavailable_until_it_returns() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let before = request_lease(&server, &acme, "before").await;
    // An outage of this test's database alone: it refuses new sessions, and its sessions end.
    let admin = leasehold_tests::server_url().connect().await.expect("the server's admin database");
    let name = server.db.name().to_owned();
    let refuse = format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS false");
    admin.batch_execute(&refuse).await.expect("the database refuses connections");
    // Ended until none is left (a session starting while the first ones ended survives them).
    let sessions =
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1";
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while admin.query_one(sessions, &[&name]).await.expect("ended").get::<_, i64>(0) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    ended.await.expect("no session of the database is left");
    until_ready_is(&server, 503).await;
    let during = server.graphql(&acme, REQUEST_LEASE, lease_request("during")).await;
    assert_eq!(code(&during), Some("UNAVAILABLE"), "{during}");
    assert!(!during.to_string().contains(&name), "the database is not named: {during}");
    // Back: the server reconnects by itself, and the request retried with its key lands.
    let allow = format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS true");
    admin.batch_execute(&allow).await.expect("the database accepts connections");
    until_ready_is(&server, 200).await;
    let (lease, _) = request_until_answered(&server, &acme, "during").await;
    // The projections resumed from their checkpoints: both leases read back.
    let query = "{ leases { edges { node { id } } } }";
    let read = server.graphql_after(&acme, query, json!({}), &lease["cursor"]).await;
    let ids: Vec<&Value> = data(&read)["leases"]["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|e| &e["node"]["id"])
        .collect();
    assert!(ids.contains(&&before["id"]) && ids.contains(&&lease["id"]), "{read}");
}
