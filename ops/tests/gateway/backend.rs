//! The lease backends in the end-to-end tests: `leasehold backend-sim` as a separate process,
//! a backends file naming it, a server dispatching to it, and waiting on what the tenant and
//! the log show.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use uuid::Uuid;

use crate::support::*;

/// The simulated backend's own secret: it signs requests to it and its callbacks (not the
/// servers' callback secret).
pub(crate) const SIM_SECRET: &str = "sim-1-own-secret-0123456789abcdef0123456789";

/// How long a lease may take to become ready.
pub(crate) const READY_WAIT: Duration = Duration::from_secs(60);

/// A running `leasehold backend-sim`; killed when dropped.
pub(crate) struct Sim {
    pub(crate) url: String,
    /// How the test reaches the simulator's own routes (a TLS test sets its CA and identity).
    pub(crate) http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Sim {
    /// Starts the simulator on `listen`, with its own secret.
    pub(crate) async fn start(listen: &str, dir: &Path) -> Sim {
        Sim::start_with(listen, dir, &[]).await
    }

    /// Starts the simulator misbehaving as `faults` say.
    pub(crate) async fn start_with(listen: &str, dir: &Path, faults: &[&str]) -> Sim {
        let args: Vec<&str> = faults.iter().flat_map(|fault| ["--fault", fault]).collect();
        Sim::start_args(listen, dir, &args).await
    }

    /// Starts the simulator with more arguments.
    pub(crate) async fn start_args(listen: &str, dir: &Path, faults: &[&str]) -> Sim {
        let secret = dir.join("sim.secret");
        std::fs::write(&secret, SIM_SECRET).expect("written");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["backend-sim", "--listen", listen, "--secret-file"])
            .arg(&secret)
            .args(if faults.contains(&"--callback-delay-ms") {
                &[][..]
            } else {
                &["--callback-delay-ms", "20"][..]
            })
            .args(faults)
            .env("LEASEHOLD_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the simulator starts");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        tokio::time::timeout(READY_WAIT, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("the simulator says where it listens")
            .expect("readable");
        let url = line.trim().strip_prefix("listening on ").expect("its first line").to_string();
        Sim { url, http: reqwest::Client::new(), _child: child }
    }

    /// How many requests `route` received.
    pub(crate) async fn received(&self, route: &str) -> u64 {
        let counts: Value = self
            .http
            .get(format!("{}/sim/requests", self.url))
            .send()
            .await
            .expect("the simulator answers")
            .json()
            .await
            .expect("JSON");
        counts[route].as_u64().unwrap_or(0)
    }
}

/// A directory for the secret and backends files, removed when dropped.
pub(crate) fn scratch() -> TempDir {
    let dir = std::env::temp_dir().join(format!("lh-dispatch-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).expect("created");
    TempDir(dir)
}

/// A backends file naming backend `sim-1` at `url`.
pub(crate) fn backends_file(dir: &Path, url: &str) -> PathBuf {
    let file = dir.join("backends.json");
    let backends = json!({ "backends": [{
        "name": "sim-1", "url": url, "secret_file": "sim.secret",
        "timeout_seconds": 5, "breaker_open_seconds": 1,
    }]});
    std::fs::write(dir.join("sim.secret"), SIM_SECRET).expect("written");
    std::fs::write(&file, backends.to_string()).expect("written");
    file
}

pub(crate) async fn serve_dispatching(file: &Path) -> Server {
    let file = file.to_str().expect("a UTF-8 path");
    Server::start_with(&["--backend", "sim-1", "--backends-file", file]).await
}

/// Polls `check` until it answers, for at most [`READY_WAIT`]; panics naming `what`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, READY_WAIT, check).await
}

/// Polls `check` until it answers, for at most `wait`; panics naming `what`.
pub(crate) async fn eventually_within<T, F, Fut>(what: &str, wait: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let waited = tokio::time::timeout(wait, async {
        loop {
            if let Some(found) = check().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("{what} did not happen in {wait:?}"))
}

/// Waits until the tenant reads the lease in `status`.
pub(crate) async fn wait_for_status(server: &Server, token: &str, lease: &Value, status: &str) {
    let query = "query($id: ID!) { lease(id: $id) { status } }";
    eventually(&format!("lease {lease} becoming {status}"), || async {
        let answer = server.graphql(token, query, json!({ "id": lease })).await;
        // The read model may not hold it yet: not found until then.
        (answer["data"]["lease"]["status"] == status).then_some(())
    })
    .await;
}

/// The event types of the lease's stream, in order.
pub(crate) async fn stream_events(server: &Server, lease: &Value) -> Vec<String> {
    let client = server.db.client().await;
    let stream = format!("lease-{}", lease.as_str().expect("an id"));
    let rows = client
        .query("SELECT event_type FROM events WHERE stream_id = $1 ORDER BY version", &[&stream])
        .await
        .expect("read");
    rows.iter().map(|row| row.get(0)).collect()
}

pub(crate) fn count(events: &[String], event_type: &str) -> usize {
    events.iter().filter(|event| *event == event_type).count()
}

/// Waits until the lease's stream holds `n` events of `event_type`; its event types.
pub(crate) async fn wait_for_events(
    server: &Server,
    lease: &Value,
    event_type: &str,
    n: usize,
) -> Vec<String> {
    eventually(&format!("lease {lease} recording {n} {event_type}"), || async {
        let events = stream_events(server, lease).await;
        (count(&events, event_type) >= n).then_some(events)
    })
    .await
}

/// A lease requested and made ready through the dispatcher; its id.
pub(crate) async fn ready_lease(server: &Server, tenant: &str, key: &str) -> Value {
    let lease = request_lease(server, tenant, key).await["id"].clone();
    wait_for_status(server, tenant, &lease, "READY").await;
    lease
}

/// The tenant releases its lease (`deprovisionLease` under `key`).
pub(crate) async fn release(server: &Server, token: &str, lease: &Value, key: &str) {
    let release =
        "mutation($input: LeaseOperationInput!) { deprovisionLease(input: $input) { id } }";
    let input = json!({ "input": { "leaseId": lease, "operationKey": key } });
    data(&server.graphql(token, release, input).await);
}
