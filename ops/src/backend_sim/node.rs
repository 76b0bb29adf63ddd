//! A simulated node agent, as mercator's agent behaves (`docs/mercator-protocol.md` §2): it
//! enrolls with its bootstrap's token, resumes with its last session token whenever its
//! session ends, sends its reconciliation (the operations it applied) after each resume,
//! beats with facts, and serves its session's commands: one under a superseded fencing token
//! is answered `applied: false`, one it applied before `applied: true, duplicate: true`; a
//! launch is applied and its workload reported running, then exited 0 after the run time; a
//! stop is applied and its workload reported exited 137; a `report_applied` lookup is
//! answered with its reconciliation naming the lookup. A silenced node is partitioned for
//! good: nothing it sends arrives any more — no beat, result, look, nor the enrollment it
//! tries when its session stream ends — so its lease passes and it stays lost; with `drop_first_launch` the first launch it is sent is
//! lost, neither applied nor answered.
//!
//! Its bodies are written here from the note, not from the gateway's types, so that the
//! simulator checks the gateway rather than agreeing with it by construction.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use leasehold_adapters::providers::wire::NodeBootstrap;
use serde_json::{Value, json};
use uuid::Uuid;

/// How a simulated node behaves.
#[derive(Debug, Clone, Copy)]
pub struct NodeOptions {
    /// How often it beats.
    pub beat_every: Duration,
    /// How long a launched workload runs before it exits 0.
    pub run_for: Duration,
    /// The first launch it is sent is lost (never applied, never answered), as by an agent
    /// that crashed as it arrived.
    pub drop_first_launch: bool,
}

/// A running node agent; dropping it stops it.
#[derive(Debug)]
pub struct NodeHandle {
    silenced: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeHandle {
    /// Cuts it off for good: nothing it sends arrives any more (see the module's doc).
    pub fn silence(&self) {
        self.silenced.store(true, Ordering::SeqCst);
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a node agent for `bootstrap`.
pub fn spawn(bootstrap: NodeBootstrap, options: NodeOptions) -> NodeHandle {
    let silenced = Arc::new(AtomicBool::new(false));
    let node = Node {
        http: reqwest::Client::new(),
        base: format!("{}/v1/node-agent", bootstrap.control_plane_url.trim_end_matches('/')),
        credential: Arc::new(Mutex::new(bootstrap.enrollment_token.clone())),
        applied: Arc::default(),
        seq: Arc::default(),
        fencing_token: Arc::default(),
        silenced: Arc::clone(&silenced),
        dropped: Arc::default(),
        bootstrap,
        options,
    };
    NodeHandle { silenced, task: tokio::spawn(node.live()) }
}

#[derive(Debug, Clone)]
struct Node {
    http: reqwest::Client,
    base: String,
    bootstrap: NodeBootstrap,
    options: NodeOptions,
    /// The bootstrap's token until the first enrollment, then the last session token.
    credential: Arc<Mutex<String>>,
    applied: Arc<Mutex<BTreeSet<Uuid>>>,
    seq: Arc<AtomicU64>,
    fencing_token: Arc<AtomicU64>,
    silenced: Arc<AtomicBool>,
    /// A launch was lost already (`drop_first_launch`).
    dropped: Arc<AtomicBool>,
}

fn facts() -> Value {
    json!({
        "observed_at": Utc::now(),
        "host": { "os": "linux", "kernel_version": "6.8.0", "architecture": "amd64",
                  "container_runtime": "docker", "runtime_version": "27.1",
                  "cpu_millis": 4000, "memory_bytes": 17_179_869_184_u64,
                  "disk_total_bytes": 100_000_000_000_u64, "disk_free_bytes": 90_000_000_000_u64 },
    })
}

impl Node {
    fn credential(&self) -> String {
        self.credential.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    async fn live(self) {
        loop {
            match self.enroll().await {
                Ok(resumed) => {
                    if resumed {
                        self.reconcile().await;
                    }
                    let beats = tokio::spawn(self.clone().beat());
                    if let Err(error) = self.serve().await {
                        tracing::debug!(%error, "a simulated node's session ended");
                    }
                    beats.abort();
                }
                Err(error) => tracing::debug!(%error, "a simulated node could not enroll"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<reqwest::Response, String> {
        if self.silenced.load(Ordering::SeqCst) {
            // Partitioned: nothing it sends arrives (no beat, result, look or enrollment).
            return Err("silenced".to_owned());
        }
        let mut request = self.http.post(format!("{}{path}", self.base)).json(body);
        if path != "/enroll" {
            request = request.bearer_auth(self.credential());
        }
        request.send().await.map_err(|error| error.without_url().to_string())
    }

    /// Enrolls (or resumes); whether it was a resume.
    async fn enroll(&self) -> Result<bool, String> {
        let body = json!({
            "node_id": self.bootstrap.node_id, "rental_id": self.bootstrap.rental_id,
            "generation": self.bootstrap.generation, "enrollment_token": self.credential(),
            "agent_version": self.bootstrap.agent_version, "facts": facts(),
        });
        let answer = self.post("/enroll", &body).await?;
        if !answer.status().is_success() {
            return Err(format!("enrollment answered {}", answer.status()));
        }
        let enrolled: Value = answer.json().await.map_err(|error| error.to_string())?;
        let session = enrolled["session_token"].as_str().ok_or("no session token")?;
        *self.credential.lock().unwrap_or_else(PoisonError::into_inner) = session.to_owned();
        let token = enrolled["fencing_token"].as_u64().unwrap_or(0);
        self.fencing_token.store(token, Ordering::SeqCst);
        Ok(enrolled["duplicate"].as_bool().unwrap_or(false))
    }

    /// Sends the operations it applied, answering the lookup `answering` if any.
    async fn reconcile_answering(&self, answering: Option<Uuid>) {
        let applied: Vec<Uuid> =
            self.applied.lock().unwrap_or_else(PoisonError::into_inner).iter().copied().collect();
        let path = format!("/{}/reconciliation", self.bootstrap.node_id);
        let mut body = json!({ "applied_operation_ids": applied });
        if let Some(lookup) = answering {
            body["lookup_operation_id"] = json!(lookup);
        }
        let _ = self.post(&path, &body).await;
    }

    async fn reconcile(&self) {
        self.reconcile_answering(None).await;
    }

    async fn beat(self) {
        loop {
            let event = self.event("heartbeat", json!({ "facts": facts() }));
            let _ = self.send(event).await;
            tokio::time::sleep(self.options.beat_every).await;
        }
    }

    fn event(&self, kind: &str, rest: Value) -> Value {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let mut event = json!({
            "id": format!("{}-{seq}", self.bootstrap.node_id), "node_id": self.bootstrap.node_id,
            "kind": kind, "observed_at": Utc::now(),
        });
        if let (Some(event), Some(rest)) = (event.as_object_mut(), rest.as_object()) {
            event.extend(rest.clone());
        }
        event
    }

    async fn send(&self, event: Value) -> Result<(), String> {
        let path = format!("/{}/events", self.bootstrap.node_id);
        let answer = self.post(&path, &json!({ "events": [event] })).await?;
        answer.status().is_success().then_some(()).ok_or_else(|| answer.status().to_string())
    }

    fn look(&self, (run, attempt): (&Value, &Value), phase: &str, exit_code: Option<i32>) -> Value {
        let mut workload = json!({
            "run_id": run, "attempt_id": attempt, "phase": phase, "observed_at": Utc::now(),
        });
        if let Some(code) = exit_code {
            workload["exit_code"] = json!(code);
        }
        self.event("workload", json!({ "workload": workload }))
    }

    /// Serves the session's commands until the stream ends.
    async fn serve(&self) -> Result<(), String> {
        let path = format!("/{}/session", self.bootstrap.node_id);
        let mut stream = self.post(&path, &json!({})).await?;
        if !stream.status().is_success() {
            return Err(format!("the session answered {}", stream.status()));
        }
        let mut buffer = Vec::new();
        while let Some(chunk) = stream.chunk().await.map_err(|error| error.to_string())? {
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                if let Ok(command) = serde_json::from_slice::<Value>(&line) {
                    self.take(&command).await;
                }
            }
        }
        Ok(())
    }

    async fn take(&self, command: &Value) {
        let Some(operation) = command["operation_id"].as_str().and_then(|id| id.parse().ok())
        else {
            return;
        };
        let given = command["fencing_token"].as_u64().unwrap_or(0);
        if given < self.fencing_token.load(Ordering::SeqCst) {
            self.result(operation, false, false).await;
            return;
        }
        let known =
            self.applied.lock().unwrap_or_else(PoisonError::into_inner).contains(&operation);
        if known {
            self.result(operation, true, true).await;
            return;
        }
        let kind = command["kind"].as_str();
        if kind == Some("report_applied") {
            // Its answer is the reconciliation itself, naming the lookup.
            self.reconcile_answering(Some(operation)).await;
            return;
        }
        if kind == Some("launch_workload")
            && self.options.drop_first_launch
            && !self.dropped.swap(true, Ordering::SeqCst)
        {
            return;
        }
        use base64::Engine as _;
        let payload = command["payload"].as_str().unwrap_or_default();
        let order: Value = base64::engine::general_purpose::STANDARD
            .decode(payload)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or(Value::Null);
        self.applied.lock().unwrap_or_else(PoisonError::into_inner).insert(operation);
        self.result(operation, true, false).await;
        let workload = (&order["run"], &order["attempt"]);
        match kind {
            Some("launch_workload") => {
                let _ = self.send(self.look(workload, "running", None)).await;
                let (node, run, attempt) =
                    (self.clone(), order["run"].clone(), order["attempt"].clone());
                tokio::spawn(async move {
                    tokio::time::sleep(node.options.run_for).await;
                    let _ = node.send(node.look((&run, &attempt), "exited", Some(0))).await;
                });
            }
            Some("stop_workload") => {
                let _ = self.send(self.look(workload, "exited", Some(137))).await;
            }
            _ => {}
        }
    }

    async fn result(&self, operation: Uuid, applied: bool, duplicate: bool) {
        let mut body = json!({
            "operation_id": operation, "applied": applied, "duplicate": duplicate,
            "reported_at": Utc::now(),
        });
        if !applied {
            body["failure"] = json!("superseded fencing token");
        }
        let path = format!("/{}/results", self.bootstrap.node_id);
        let _ = self.post(&path, &body).await;
    }
}
