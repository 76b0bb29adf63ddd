//! Restore, as fred's docker backend answers it: 422 `no retained data for lease` unless the
//! source is retained here, 409 `already_provisioned` when the new lease is held; otherwise
//! 202, the source's record consumed, and after the delay the new lease ready and its
//! callback sent (with `--fault fail`, a failed one).
//!
//! Restart and update, as fred's docker backend answers them: 404 when the lease is not held,
//! 409 unless it is `ready` or `failed`, 400 for an update without a payload; otherwise 202,
//! and after the delay a signed callback to the new `callback_url` (which replaces the stored
//! one) echoing `maintenance_id` and `maintenance_admitted_at` as the seed's backends do, or
//! neither with `--fault omit-stamp`. With `--fault rollback` the work fails and is rolled
//! back: the old containers run (`ready`) and the callback reports `failed`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasehold_adapters::backends::wire::{
    CallbackPayload, ProvisionRequest, RestartRequest, RestoreRequest, UpdateRequest,
};
use serde_json::json;
use uuid::Uuid;

use super::routes::{error, send_callback};
use super::{Fault, Sim};

/// What a restart or an update asked for.
struct Asked {
    lease: Uuid,
    callback_url: String,
    maintenance_id: Option<String>,
    admitted_at: Option<String>,
    /// An update (a new release when it takes), not a restart.
    update: bool,
}

pub(super) async fn restart(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.received("restart");
    let Ok(request) = serde_json::from_slice::<RestartRequest>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid request body");
    };
    let asked = Asked {
        lease: request.lease_uuid,
        callback_url: request.callback_url,
        maintenance_id: request.maintenance_id,
        admitted_at: request.admitted_at,
        update: false,
    };
    start(sim, asked, ("restarting", "restart")).await
}

pub(super) async fn update(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.received("update");
    let Ok(request) = serde_json::from_slice::<UpdateRequest>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid request body");
    };
    if request.payload.is_empty() {
        return error(StatusCode::BAD_REQUEST, "payload is required");
    }
    let asked = Asked {
        lease: request.lease_uuid,
        callback_url: request.callback_url,
        maintenance_id: request.maintenance_id,
        admitted_at: request.admitted_at,
        update: true,
    };
    start(sim, asked, ("updating", "update")).await
}

async fn start(sim: Sim, asked: Asked, (status, what): (&'static str, &str)) -> Response {
    {
        let mut provisions = sim.provisions();
        let Some(provision) = provisions.get_mut(&asked.lease) else {
            return error(StatusCode::NOT_FOUND, "lease not provisioned");
        };
        if !matches!(provision.status, "ready" | "failed") {
            return error(StatusCode::CONFLICT, &format!("invalid state for {what}"));
        }
        provision.status = status;
        provision.request.callback_url.clone_from(&asked.callback_url);
    }
    tokio::spawn(complete(sim, asked));
    (StatusCode::ACCEPTED, axum::Json(json!({ "status": status }))).into_response()
}

async fn complete(sim: Sim, asked: Asked) {
    tokio::time::sleep(sim.callback_delay).await;
    let rolled_back = sim.has(Fault::Rollback);
    {
        let mut provisions = sim.provisions();
        let Some(provision) = provisions.get_mut(&asked.lease) else { return };
        provision.status = "ready";
        if asked.update && !rolled_back {
            provision.releases += 1;
        }
    }
    let stamped = !sim.has(Fault::OmitStamp);
    let payload = CallbackPayload {
        lease_uuid: asked.lease.to_string(),
        status: if rolled_back { "failed" } else { "success" }.into(),
        error: rolled_back.then(|| "the new containers did not start; rolled back".to_string()),
        backend: Some(sim.name.clone()),
        retained: false,
        maintenance_id: asked.maintenance_id.filter(|_| stamped),
        maintenance_admitted_at: asked.admitted_at.filter(|_| stamped),
        rolled_back: rolled_back.then_some(true),
    };
    send_callback(&sim, &asked.callback_url, &payload).await;
}

pub(super) async fn restore(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.received("restore");
    let Ok(request) = serde_json::from_slice::<RestoreRequest>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid request body");
    };
    {
        let mut provisions = sim.provisions();
        let Some(retained) =
            provisions.get(&request.from_lease_uuid).filter(|p| p.status == "retained")
        else {
            return error(StatusCode::UNPROCESSABLE_ENTITY, "no retained data for lease");
        };
        let skus = |items: &[leasehold_adapters::backends::wire::LeaseItem]| {
            let mut skus: Vec<String> = items.iter().map(|item| item.sku.clone()).collect();
            skus.sort();
            skus
        };
        // Another tier: a promote fits; with `--fault demote-overflow`, the measured data
        // does not fit the smaller one.
        if sim.has(super::Fault::DemoteOverflow)
            && skus(&retained.request.items) != skus(&request.items)
        {
            let body = json!({
                "error": "the retained data (12000 MB) does not fit the requested tier (8000 MB)",
                "code": "demote_exceeds_tier",
            });
            return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response();
        }
        if provisions.contains_key(&request.lease_uuid) {
            let body =
                json!({ "error": "lease already provisioned", "code": "already_provisioned" });
            return (StatusCode::CONFLICT, axum::Json(body)).into_response();
        }
        provisions.remove(&request.from_lease_uuid);
        let provision = ProvisionRequest {
            lease_uuid: request.lease_uuid,
            tenant: request.tenant.clone(),
            provider_uuid: request.provider_uuid,
            items: request.items.clone(),
            callback_url: request.callback_url.clone(),
            payload: None,
            payload_hash: None,
            lifecycle_callback_url: None,
        };
        let created_at = chrono::Utc::now();
        let held =
            super::Provision { request: provision, status: "restarting", created_at, releases: 1 };
        provisions.insert(request.lease_uuid, held);
    }
    tokio::spawn(super::routes::complete(sim, request.lease_uuid));
    (StatusCode::ACCEPTED, axum::Json(json!({ "status": "restoring" }))).into_response()
}
