//! `leasehold backend-sim --host-agent`: a host agent speaking fuse's contract
//! (`docs/fuse-host-agent-protocol.md`), in memory: `POST /v1/vm` boots a pretend VM and answers
//! once it "booted", `GET /v1/vm/{id}`, `GET /v1/vm?prefix=`, `DELETE /v1/vm/{id}`,
//! `GET /v1/capacity` and `GET /healthz`, snapshots, forks and artifact transfers between
//! agents (`copies.rs`), every route behind `Authorization: Bearer <token>` (an artifact's
//! read behind its grant instead), every error a plain-text body. `--fail-boots` makes boots fail (500, rolled back),
//! `--fail-deletes` deletes (500), `--export-later` takes exports on (202) without writing them;
//! `POST /sim/vanish/{id}` drops a VM as a crashed host would; `GET /sim/requests` counts the
//! requests per route.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold_adapters::hosts::wire::{AgentCapacity, AgentVm, AgentVms, CreateVmRequest};

mod copies;

use copies::SimSnapshot;

/// The agent's state.
#[derive(Debug, Clone)]
pub struct HostAgent {
    token: Arc<String>,
    vms: Arc<Mutex<BTreeMap<String, AgentVm>>>,
    /// The host-wide snapshot store, by snapshot id.
    snapshots: Arc<Mutex<BTreeMap<String, SimSnapshot>>>,
    /// For pulls from peer agents.
    http: reqwest::Client,
    requests: Arc<Mutex<BTreeMap<String, u64>>>,
    fail_boots: bool,
    fail_deletes: bool,
    export_later: bool,
}

impl HostAgent {
    /// An agent wanting `token`, failing every boot when `fail_boots` and every delete when
    /// `fail_deletes`.
    pub fn new(token: &str, (fail_boots, fail_deletes): (bool, bool)) -> Self {
        Self {
            token: Arc::new(token.to_owned()),
            vms: Arc::default(),
            snapshots: Arc::default(),
            http: reqwest::Client::new(),
            requests: Arc::default(),
            fail_boots,
            fail_deletes,
            export_later: false,
        }
    }

    /// The same agent, taking exports on (202) instead of writing them when `later`.
    #[must_use]
    pub fn exporting_later(self, later: bool) -> Self {
        Self { export_later: later, ..self }
    }

    fn vms(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AgentVm>> {
        self.vms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SimSnapshot>> {
        self.snapshots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Boots a pretend VM named `name` (a create's, a fork's) and answers it: 409 when one is
    /// there.
    fn boot(&self, name: &str) -> Response {
        if self.fail_boots {
            return text(StatusCode::INTERNAL_SERVER_ERROR, "firecracker exited during boot");
        }
        let id = sanitize(name);
        let mut vms = self.vms();
        if vms.contains_key(&id) {
            return text(StatusCode::CONFLICT, &format!("vm {id} already exists"));
        }
        let port = 19_550 + vms.len() + 1;
        let vm = AgentVm { vm_id: id.clone(), url: format!("127.0.0.1:{port}") };
        vms.insert(id, vm.clone());
        (StatusCode::OK, axum::Json(vm)).into_response()
    }

    /// Counts a request under `route`.
    fn count(&self, route: &str) {
        *self
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(route.into())
            .or_default() += 1;
    }

    /// Whether the request carries the exact bearer token (as fuse's agent wants, `/healthz`
    /// too); counts it under `route`.
    fn allows(&self, headers: &HeaderMap, route: &str) -> bool {
        self.count(route);
        let expected = format!("Bearer {}", self.token);
        let given = headers.get("authorization").and_then(|value| value.to_str().ok());
        given == Some(expected.as_str())
    }
}

fn text(status: StatusCode, message: &str) -> Response {
    (status, [("content-type", "text/plain")], message.to_owned()).into_response()
}

/// fuse's `sanitize_name`: lower-cased, runs of anything but `[a-z0-9-]` become `-`, trimmed
/// of `-`; empty is `vm`.
fn sanitize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut dash = false;
    for c in name.to_lowercase().chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
            out.push(c);
            dash = false;
        } else if !dash {
            out.push('-');
            dash = true;
        }
    }
    let trimmed = out.trim_matches('-');
    if trimmed.is_empty() { "vm".to_owned() } else { trimmed.to_owned() }
}

/// The agent's routes.
pub fn router(agent: HostAgent) -> Router {
    Router::new()
        .route("/v1/vm", post(create).get(list))
        .route("/v1/vm/{id}", get(read).delete(delete))
        .route("/v1/vm/{id}/snapshot", post(copies::snapshot))
        .route("/v1/vm/{id}/fork", post(copies::fork))
        .route("/v1/vm/{id}/restore", post(copies::restore))
        .route("/v1/vm/{id}/snapshots/{snapshot}/export", post(copies::export))
        .route("/v1/artifacts/{digest}", get(copies::artifact))
        .route("/v1/artifacts/{digest}/pull", post(copies::pull))
        .route("/v1/capacity", get(capacity))
        .route("/healthz", get(health))
        .route("/sim/vanish/{id}", post(vanish))
        .route("/sim/requests", get(requests))
        .with_state(agent)
}

async fn create(State(agent): State<HostAgent>, headers: HeaderMap, body: String) -> Response {
    if !agent.allows(&headers, "create") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let request: CreateVmRequest = match serde_json::from_str(&body) {
        Ok(request) => request,
        Err(error) => return text(StatusCode::BAD_REQUEST, &format!("bad JSON: {error}")),
    };
    // A seed names the host-wide store: a snapshot taken here or pulled from a peer.
    let seed = request.seed_snapshot.as_deref().filter(|seed| !seed.is_empty());
    if seed.is_some_and(|seed| !agent.snapshots().contains_key(seed)) {
        return text(StatusCode::NOT_FOUND, "snapshot not found");
    }
    agent.boot(&request.name)
}

async fn list(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    if !agent.allows(&headers, "list") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let prefix = query.get("prefix").cloned().unwrap_or_default();
    let vms = agent.vms().values().filter(|vm| vm.vm_id.starts_with(&prefix)).cloned().collect();
    (StatusCode::OK, axum::Json(AgentVms { vms })).into_response()
}

async fn read(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if !agent.allows(&headers, "read") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    match agent.vms().get(&sanitize(&id)) {
        Some(vm) => (StatusCode::OK, axum::Json(vm.clone())).into_response(),
        None => text(StatusCode::NOT_FOUND, "vm not found"),
    }
}

async fn delete(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if !agent.allows(&headers, "delete") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    if agent.fail_deletes {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "firecracker would not die");
    }
    match agent.vms().remove(&sanitize(&id)) {
        Some(_) => text(StatusCode::NO_CONTENT, ""),
        None => text(StatusCode::NOT_FOUND, "vm not found"),
    }
}

async fn capacity(State(agent): State<HostAgent>, headers: HeaderMap) -> Response {
    if !agent.allows(&headers, "capacity") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let capacity = AgentCapacity {
        cpus: 16,
        ram_mb: 65_536,
        storage_gb: 1_000,
        arch: "amd64".into(),
        gpus: 0,
    };
    (StatusCode::OK, axum::Json(capacity)).into_response()
}

async fn health(State(agent): State<HostAgent>, headers: HeaderMap) -> Response {
    if !agent.allows(&headers, "health") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    (StatusCode::OK, axum::Json(serde_json::json!({ "ok": true, "app_name": "fc-agent" })))
        .into_response()
}

async fn vanish(State(agent): State<HostAgent>, Path(id): Path<String>) -> StatusCode {
    match agent.vms().remove(&sanitize(&id)) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

async fn requests(State(agent): State<HostAgent>) -> axum::Json<BTreeMap<String, u64>> {
    axum::Json(agent.requests.lock().unwrap_or_else(PoisonError::into_inner).clone())
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_sanitized_as_fuse_does() {
        assert_eq!(super::sanitize("lh-0000-ab"), "lh-0000-ab");
        assert_eq!(super::sanitize("Fuse_Task.1"), "fuse-task-1");
        assert_eq!(super::sanitize("--"), "vm");
    }
}
