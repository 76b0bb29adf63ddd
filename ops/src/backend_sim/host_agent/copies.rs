//! The simulated agent's snapshots, forks and artifact transfers, as fuse's agent has them:
//! `POST /v1/vm/{id}/snapshot` (an id of the agent's choosing, `snap-<seconds>-<6 hex>`, the
//! digest of the rootfs only, the kind as taken), `POST /v1/vm/{id}/fork` (a new VM from one of
//! the store's snapshots; the source keeps running), `GET /v1/artifacts/{digest}` (behind a
//! grant minted with this agent's token, never the bearer token; every failure the same 403)
//! and `POST /v1/artifacts/{digest}/pull` (fetched from a peer with a grant, filed only once
//! its digest verified; any failure 422).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use leasehold_adapters::hosts::grant::{self, GRANT_HEADER};
use leasehold_adapters::hosts::wire::{
    ArtifactPullRequest, ArtifactPulled, ExportRequest, ForkVmRequest, RestoreRequest,
    SnapshotRequest, SnapshotTaken,
};
use sha2::{Digest, Sha256};

use super::{HostAgent, sanitize, text};

/// A snapshot in the host-wide store: its pretend rootfs and what was recorded of it.
#[derive(Debug, Clone)]
pub struct SimSnapshot {
    rootfs: Bytes,
    digest: String,
}

fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// fuse's agent reads a missing body as `{}`.
fn body_or_empty(body: &str) -> &str {
    if body.is_empty() { "{}" } else { body }
}

fn bad_json(error: &serde_json::Error) -> Response {
    text(StatusCode::BAD_REQUEST, &format!("bad JSON: {error}"))
}

pub async fn snapshot(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: String,
) -> Response {
    if !agent.allows(&headers, "snapshot") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let request: SnapshotRequest = match serde_json::from_str(body_or_empty(&body)) {
        Ok(request) => request,
        Err(error) => return bad_json(&error),
    };
    let id = sanitize(&id);
    if !agent.vms().contains_key(&id) {
        return text(StatusCode::NOT_FOUND, "vm not found");
    }
    let seconds = chrono::Utc::now().timestamp();
    let snapshot_id =
        format!("snap-{seconds}-{}", &uuid::Uuid::now_v7().simple().to_string()[26..]);
    let rootfs = Bytes::from(format!("rootfs of {id} at {snapshot_id}").into_bytes());
    let digest = digest_of(&rootfs);
    let kind = if request.live { "live" } else { "disk" };
    // A live snapshot's size counts its memory image, as fuse's agent's does.
    let memory = if request.live { SIM_MEMORY_IMAGE_BYTES } else { 0 };
    let taken = SnapshotTaken {
        snapshot_id: snapshot_id.clone(),
        digest: digest.clone(),
        kind: kind.into(),
        size_bytes: rootfs.len() as u64 + memory,
    };
    agent.snapshots().insert(snapshot_id, SimSnapshot { rootfs, digest });
    (StatusCode::OK, axum::Json(taken)).into_response()
}

/// The memory image a simulated live snapshot writes beside its rootfs, in bytes.
pub const SIM_MEMORY_IMAGE_BYTES: u64 = 4096;

/// `POST /v1/vm/{id}/restore`: in place, from a snapshot of the host's store.
pub async fn restore(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: String,
) -> Response {
    if !agent.allows(&headers, "restore") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let request: RestoreRequest = match serde_json::from_str(body_or_empty(&body)) {
        Ok(request) => request,
        Err(error) => return bad_json(&error),
    };
    if request.snapshot_id.is_empty() || request.snapshot_id.contains(['/', '.']) {
        return text(StatusCode::BAD_REQUEST, "invalid snapshot id");
    }
    if !agent.vms().contains_key(&sanitize(&id)) {
        return text(StatusCode::NOT_FOUND, "vm not found");
    }
    if !agent.snapshots().contains_key(&request.snapshot_id) {
        return text(StatusCode::NOT_FOUND, "snapshot not found");
    }
    (StatusCode::OK, axum::Json(serde_json::json!({ "ok": true }))).into_response()
}

/// `POST /v1/vm/{id}/snapshots/{snapshot}/export`, Leasehold's route (fuse's agent has
/// none): the snapshot "written" to its destination at once (200), counted under `export`.
pub async fn export(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path((id, snapshot)): Path<(String, String)>,
    body: String,
) -> Response {
    if !agent.allows(&headers, "export") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let request: ExportRequest = match serde_json::from_str(&body) {
        Ok(request) => request,
        Err(error) => return bad_json(&error),
    };
    if request.destination.is_empty() {
        return text(StatusCode::BAD_REQUEST, "destination required");
    }
    // A snapshot outlives its VM in the host's store: its export needs only the snapshot.
    let _ = id;
    if !agent.snapshots().contains_key(&snapshot) {
        return text(StatusCode::NOT_FOUND, "snapshot not found");
    }
    let status = if agent.export_later { StatusCode::ACCEPTED } else { StatusCode::OK };
    (status, axum::Json(serde_json::json!({ "destination": request.destination }))).into_response()
}

pub async fn fork(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: String,
) -> Response {
    if !agent.allows(&headers, "fork") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let request: ForkVmRequest = match serde_json::from_str(body_or_empty(&body)) {
        Ok(request) => request,
        Err(error) => return bad_json(&error),
    };
    if !agent.vms().contains_key(&sanitize(&id)) {
        return text(StatusCode::NOT_FOUND, "source vm not found");
    }
    if request.snapshot_id.is_empty() {
        return text(StatusCode::BAD_REQUEST, "snapshot_id required");
    }
    if !agent.snapshots().contains_key(&request.snapshot_id) {
        return text(StatusCode::NOT_FOUND, "snapshot not found");
    }
    agent.boot(&request.name)
}

/// Agent to agent: the artifact's bytes, to the bearer of a grant for exactly this digest.
pub async fn artifact(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(digest): Path<String>,
) -> Response {
    agent.count("artifact");
    let presented = headers.get(GRANT_HEADER).and_then(|value| value.to_str().ok());
    let now = chrono::Utc::now().timestamp();
    if !presented.is_some_and(|grant| grant::verify(&agent.token, grant, &digest, now)) {
        return text(StatusCode::FORBIDDEN, "forbidden");
    }
    let found = agent.snapshots().values().find(|snapshot| snapshot.digest == digest).cloned();
    match found {
        Some(snapshot) => (
            StatusCode::OK,
            [
                ("content-type", "application/octet-stream"),
                ("x-fuse-artifact-digest", digest.as_str()),
            ],
            snapshot.rootfs,
        )
            .into_response(),
        None => text(StatusCode::NOT_FOUND, "artifact not found"),
    }
}

pub async fn pull(
    State(agent): State<HostAgent>,
    headers: HeaderMap,
    Path(digest): Path<String>,
    body: String,
) -> Response {
    if !agent.allows(&headers, "pull") {
        return text(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let request: ArtifactPullRequest = match serde_json::from_str(body_or_empty(&body)) {
        Ok(request) => request,
        Err(error) => return bad_json(&error),
    };
    if request.grant.is_empty() {
        return text(StatusCode::BAD_REQUEST, "grant required");
    }
    let url = format!("{}/v1/artifacts/{digest}", request.peer_url.trim_end_matches('/'));
    // The grant and nothing else: this agent holds no token of the peer's.
    let fetched = agent.http.get(url).header(GRANT_HEADER, &request.grant).send().await;
    let rootfs = match fetched {
        Ok(response) if response.status().is_success() => match response.bytes().await {
            Ok(bytes) => bytes,
            Err(error) => return text(StatusCode::UNPROCESSABLE_ENTITY, &error.to_string()),
        },
        Ok(response) => {
            let status = response.status().as_u16();
            let message = format!("peer returned {status} for artifact {digest}");
            return text(StatusCode::UNPROCESSABLE_ENTITY, &message);
        }
        Err(error) => return text(StatusCode::UNPROCESSABLE_ENTITY, &error.to_string()),
    };
    if digest_of(&rootfs) != digest {
        return text(StatusCode::UNPROCESSABLE_ENTITY, "artifact digest mismatch");
    }
    let snapshot_id = if request.snapshot_id.is_empty() {
        format!("art-{}", &digest[..16])
    } else {
        request.snapshot_id
    };
    let pulled = ArtifactPulled {
        snapshot_id: snapshot_id.clone(),
        digest: digest.clone(),
        bytes: rootfs.len() as u64,
    };
    agent.snapshots().insert(snapshot_id, SimSnapshot { rootfs, digest });
    (StatusCode::OK, axum::Json(pulled)).into_response()
}
