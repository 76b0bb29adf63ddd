//! The simulator's routes, with fred's docker backend's answers: 401 for a missing or bad
//! signature, 413 above 2 MiB, 400 with the error envelope for a bad body, 409
//! `already_provisioned`, 404 before a provision is ready.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold_adapters::backends::SIGNATURE_HEADER;
use leasehold_adapters::backends::wire::{
    CallbackPayload, DeprovisionRequest, LeaseInfo, LeaseInstance, PortBinding, ProvisionInfo,
    ProvisionRequest, ProvisionsPage, ReconcileCustomDomainRequest, ReleaseInfo, RetainedLease,
    RetentionsPage, TerminalBudget,
};
use serde_json::json;
use uuid::Uuid;

use super::{Fault, Provision, Sim};

/// fred's backends' inbound body cap (`DefaultMaxRequestBodySize`).
const REQUEST_BODY_BYTES_MAX: usize = 2 << 20;

/// Largest keyset page served (`MaxPageLimit`).
const PAGE_LIMIT_MAX: usize = 5_000;

/// A backend's callback attempts and the pause before each (fred's callback sender).
const CALLBACK_BACKOFF: [Duration; 3] =
    [Duration::ZERO, Duration::from_secs(1), Duration::from_secs(5)];

pub(super) fn router(sim: Sim) -> Router {
    let signed = Router::new()
        .route("/provision", post(provision))
        .route("/deprovision", post(deprovision))
        .route("/restart", post(super::maintenance::restart))
        .route("/update", post(super::maintenance::update))
        .route("/restore", post(super::maintenance::restore))
        .route("/info/{lease}", get(info))
        .route("/provisions", get(provisions))
        .route("/provisions/{lease}", get(provision_info))
        .route("/retentions", get(retentions))
        .route("/logs/{lease}", get(logs))
        .route("/releases/{lease}", get(releases))
        .route("/reconcile_custom_domain", post(reconcile_custom_domain))
        .route_layer(middleware::from_fn_with_state(sim.clone(), verify_signature));
    Router::new()
        .merge(signed)
        .route("/health", get(|| async { axum::Json(json!({ "status": "healthy" })) }))
        .route("/stats", get(stats))
        .route("/sim/requests", get(received))
        .route("/sim/sweep/{lease}", post(sweep))
        .route("/sim/fail/{lease}", post(fail))
        .with_state(sim)
}

pub(super) fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// Reads the body under the cap and checks its signature, as fred's backends do before any
/// handler runs.
async fn verify_signature(State(sim): State<Sim>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, REQUEST_BODY_BYTES_MAX).await else {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    };
    let Some(header) = parts.headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok()) else {
        return error(StatusCode::UNAUTHORIZED, "missing signature");
    };
    let target = parts.uri.path_and_query().map_or(parts.uri.path(), |t| t.as_str());
    let signed = (parts.method.as_str(), target, &body[..]);
    if sim.secret.verify(Some(header), signed, chrono::Utc::now()).is_err() {
        return error(StatusCode::UNAUTHORIZED, "invalid signature");
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}

async fn provision(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.received("provision");
    let request: ProvisionRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(_) => return error(StatusCode::BAD_REQUEST, "invalid request body"),
    };
    if request.items.is_empty() || request.items.iter().any(|item| item.quantity == 0) {
        return error(
            StatusCode::BAD_REQUEST,
            "items must name at least one SKU, each at least once",
        );
    }
    if !(request.callback_url.starts_with("http://")
        || request.callback_url.starts_with("https://"))
    {
        return error(StatusCode::BAD_REQUEST, "callback_url must be http(s)");
    }
    // As fred's backends: a manifest sent with a hash must match it.
    if let Some(payload) = &request.payload {
        use sha2::Digest as _;
        let hash = hex::encode(sha2::Sha256::digest(payload));
        if request.payload_hash.as_deref().is_some_and(|sent| sent != hash) {
            return error(StatusCode::BAD_REQUEST, "payload_hash does not match the payload");
        }
        sim.received("provision-payload");
    }
    if let Some(refused) = refusal(&sim) {
        return refused;
    }
    if sim.has(Fault::Timeout) {
        std::future::pending::<()>().await;
    }
    let lease = request.lease_uuid;
    {
        let mut provisions = sim.provisions();
        // Only a failed provision is accepted again; the stored callback URL is kept.
        if provisions.get(&lease).is_some_and(|p| p.status != "failed") {
            let body =
                json!({ "error": "lease already provisioned", "code": "already_provisioned" });
            return (StatusCode::CONFLICT, axum::Json(body)).into_response();
        }
        let created_at = chrono::Utc::now();
        let held = Provision { request, status: "provisioning", created_at, releases: 1 };
        provisions.insert(lease, held);
        // The provisions it acted on, beside those it received: a client sending one twice
        // must never make it act twice.
        sim.received("provision-accepted");
    }
    tokio::spawn(complete(sim, lease));
    (StatusCode::ACCEPTED, axum::Json(json!({ "provision_id": lease.to_string() }))).into_response()
}

/// The refusal `--fault` asks provisions to get, if any.
fn refusal(sim: &Sim) -> Option<Response> {
    let body = if sim.has(Fault::Garbage) {
        // A 400 whose body is not the envelope: the case that must never read as a refusal.
        let page = "<html><body>400 Bad Request /var/lib/sim</body></html>";
        return Some((StatusCode::BAD_REQUEST, page).into_response());
    } else if sim.has(Fault::RefuseValidation) {
        json!({ "error": "sku is not offered here", "validation_code": "unknown_sku" })
    } else if sim.has(Fault::RefuseCapacity) {
        return Some(error(StatusCode::SERVICE_UNAVAILABLE, "insufficient resources"));
    } else {
        return None;
    };
    Some((StatusCode::BAD_REQUEST, axum::Json(body)).into_response())
}

/// After the delay, the provision is ready and its callback is sent.
pub(super) async fn complete(sim: Sim, lease: Uuid) {
    tokio::time::sleep(sim.callback_delay).await;
    let callback_url = {
        let mut provisions = sim.provisions();
        let Some(provision) = provisions.get_mut(&lease) else { return };
        provision.status = if sim.has(Fault::Fail) { "failed" } else { "ready" };
        provision.request.callback_url.clone()
    };
    let failed = sim.has(Fault::Fail);
    let payload = CallbackPayload {
        lease_uuid: lease.to_string(),
        status: if failed { "failed" } else { "success" }.into(),
        error: failed.then(|| "image pull failed".to_string()),
        backend: Some(sim.name.clone()),
        retained: false,
        maintenance_id: None,
        maintenance_admitted_at: None,
        rolled_back: None,
    };
    send_callback(&sim, &callback_url, &payload).await;
}

/// Signs and posts a callback: three attempts, any 2xx ends them.
pub(super) async fn send_callback(sim: &Sim, url: &str, payload: &CallbackPayload) {
    let body = serde_json::to_vec(payload).expect("a callback serializes");
    let target = url::target_of(url);
    for pause in CALLBACK_BACKOFF {
        tokio::time::sleep(pause).await;
        let signature = sim.secret.sign(chrono::Utc::now().timestamp(), "POST", &target, &body);
        let sent = sim
            .http
            .post(url)
            .header(SIGNATURE_HEADER, signature)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return,
            Ok(response) => tracing::warn!(status = %response.status(), "callback refused"),
            Err(error) => tracing::warn!(error = %error.without_url(), "callback not delivered"),
        }
    }
}

async fn deprovision(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.received("deprovision");
    let Ok(request) = serde_json::from_slice::<DeprovisionRequest>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid request body");
    };
    let mut provisions = sim.provisions();
    match provisions.get_mut(&request.lease_uuid) {
        Some(provision) if sim.retain && provision.status != "retained" => {
            provision.status = "retained";
        }
        Some(_) if sim.retain => {}
        _ => {
            provisions.remove(&request.lease_uuid);
        }
    }
    axum::Json(json!({ "status": "ok" })).into_response()
}

async fn info(State(sim): State<Sim>, Path(lease): Path<Uuid>) -> Response {
    if sim.provisions().get(&lease).is_none_or(|p| p.status != "ready") {
        return error(StatusCode::NOT_FOUND, "lease not provisioned");
    }
    let port = PortBinding { host_ip: "127.0.0.1".into(), host_port: "8080".into() };
    let fqdn = format!("{lease}.{}.sim.local", sim.name);
    let instance = LeaseInstance {
        instance_index: 0,
        container_id: Some(format!("sim-container-{}", lease.simple())),
        image: Some("sim/app:1".into()),
        status: Some("running".into()),
        fqdn: Some(fqdn.clone()),
        ports: Some(BTreeMap::from([("80/tcp".to_string(), port.clone())])),
    };
    let info = LeaseInfo {
        host: Some("127.0.0.1".into()),
        fqdn: Some(fqdn),
        protocol: Some("tcp".into()),
        ports: Some(BTreeMap::from([("80/tcp".to_string(), port)])),
        instances: Some(vec![instance]),
        metadata: Some(BTreeMap::from([("node".to_string(), "/var/lib/sim/node-1".to_string())])),
        ..LeaseInfo::default()
    };
    (StatusCode::OK, axum::Json(info)).into_response()
}

/// `POST /reconcile_custom_domain`: the items' custom domains onto the running provision
/// (`204`; also when there is nothing to change, or no such lease here, as fred's backends).
async fn reconcile_custom_domain(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.received("reconcile_custom_domain");
    let Ok(request) = serde_json::from_slice::<ReconcileCustomDomainRequest>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid request body");
    };
    if let Some(provision) = sim.provisions().get_mut(&request.lease_uuid) {
        for item in &mut provision.request.items {
            let wanted = request.items.iter().find(|w| w.service_name == item.service_name);
            if let Some(wanted) = wanted {
                item.custom_domain.clone_from(&wanted.custom_domain);
            }
        }
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `GET /logs/{lease}?tail=N`: each instance's last `tail` lines, by instance index.
async fn logs(State(sim): State<Sim>, Path(lease): Path<Uuid>, request: Request) -> Response {
    sim.received("logs");
    let tail = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("tail="))
        .and_then(|tail| tail.parse::<usize>().ok())
        .unwrap_or(100);
    if sim.provisions().get(&lease).is_none_or(|p| p.status == "retained") {
        return error(StatusCode::NOT_FOUND, "lease not provisioned");
    }
    let lines: Vec<String> = (1..=3).map(|n| format!("{lease} line {n}")).collect();
    let kept = lines[lines.len().saturating_sub(tail)..].join("\n");
    axum::Json(json!({ "0": kept })).into_response()
}

/// `GET /releases/{lease}`: its releases, oldest first, the last one active.
async fn releases(State(sim): State<Sim>, Path(lease): Path<Uuid>) -> Response {
    sim.received("releases");
    let Some(provision) = sim.provisions().get(&lease).cloned() else {
        return error(StatusCode::NOT_FOUND, "lease not provisioned");
    };
    let list: Vec<ReleaseInfo> = (1..=provision.releases)
        .map(|version| ReleaseInfo {
            version,
            image: format!("sim/app:{version}"),
            status: if version == provision.releases { "active" } else { "superseded" }.into(),
            created_at: provision.created_at,
            reason: None,
            message: None,
            manifest: Vec::new(),
        })
        .collect();
    axum::Json(list).into_response()
}

/// `GET /provisions`: a lookup (`lease_uuid=..` repeated, 1 to 100), or keyset pages
/// (`limit`, `continue`: entries strictly after it, ascending; `continue` in the answer only
/// when more follow a full page).
async fn provisions(State(sim): State<Sim>, request: Request) -> Response {
    let query = request.uri().query().unwrap_or_default();
    let pairs: Vec<(&str, &str)> = query.split('&').filter_map(|p| p.split_once('=')).collect();
    let lookup: Vec<&str> =
        pairs.iter().filter(|(k, _)| *k == "lease_uuid").map(|(_, v)| *v).collect();
    let held = sim.provisions().clone();
    if !lookup.is_empty() {
        let Ok(ids) = lookup.iter().map(|id| id.parse::<Uuid>()).collect::<Result<Vec<_>, _>>()
        else {
            return error(StatusCode::BAD_REQUEST, "invalid lease_uuid");
        };
        if ids.len() > 100 {
            return error(StatusCode::BAD_REQUEST, "at most 100 lease_uuid");
        }
        let found = ids.iter().filter_map(|id| held.get(id)).map(|p| info_of(&sim, p)).collect();
        return page(found, None);
    }
    sim.received("inventory");
    if sim.has(Fault::PartialInventory) && pairs.iter().any(|(k, _)| *k == "continue") {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "inventory store unavailable");
    }
    let listed = held.values().map(|p| (p.request.lease_uuid, info_of(&sim, p))).collect();
    match keyset(&pairs, listed) {
        Ok((taken, next)) if sim.has(Fault::PartialInventory) => {
            // Claims another page follows, which then fails: the listing is never complete.
            let next = next.or_else(|| taken.last().map(|p| p.lease_uuid.to_string()));
            page(taken, next.or_else(|| Some(Uuid::nil().to_string())))
        }
        Ok((taken, next)) => page(taken, next),
        Err(refused) => error(StatusCode::BAD_REQUEST, refused),
    }
}

/// One keyset page of `items`, or why the query is refused (`limit`, `continue`: entries strictly after it, ascending by
/// the lease's canonical text, as fred sorts; `continue` in the answer only when more follow).
fn keyset<T>(
    pairs: &[(&str, &str)],
    mut items: Vec<(Uuid, T)>,
) -> Result<(Vec<T>, Option<String>), &'static str> {
    let value = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let Ok(limit) = value("limit").map_or(Ok(0), str::parse::<usize>) else {
        return Err("invalid limit");
    };
    let after = match value("continue").map(str::parse::<Uuid>) {
        None => None,
        Some(Ok(after)) if limit > 0 => Some(after.to_string()),
        Some(_) => return Err("invalid continue"),
    };
    let limit = if limit == 0 { usize::MAX } else { limit.min(PAGE_LIMIT_MAX) };
    items.sort_by_key(|(lease, _)| lease.to_string());
    let rest: Vec<(Uuid, T)> = items
        .into_iter()
        .filter(|(lease, _)| after.as_ref().is_none_or(|after| lease.to_string() > *after))
        .collect();
    let more = rest.len() > limit;
    let taken: Vec<(Uuid, T)> = rest.into_iter().take(limit).collect();
    let next = more.then(|| taken.last().map(|(lease, _)| lease.to_string())).flatten();
    Ok((taken.into_iter().map(|(_, item)| item).collect(), next))
}

/// `GET /retentions`: the leases whose data is retained, in keyset pages.
async fn retentions(State(sim): State<Sim>, request: Request) -> Response {
    sim.received("retentions");
    let query = request.uri().query().unwrap_or_default();
    let pairs: Vec<(&str, &str)> = query.split('&').filter_map(|p| p.split_once('=')).collect();
    let held = sim.provisions().clone();
    let retained = held
        .values()
        .filter(|p| p.status == "retained")
        .map(|p| {
            let lease = p.request.lease_uuid;
            let tenant = (!sim.has(Fault::AnonymousInventory)).then(|| p.request.tenant.clone());
            let entry = RetainedLease {
                lease_uuid: lease,
                provider_uuid: Some(p.request.provider_uuid),
                tenant,
            };
            (lease, entry)
        })
        .collect();
    match keyset(&pairs, retained) {
        Ok((retentions, next)) => {
            (StatusCode::OK, axum::Json(RetentionsPage { retentions, next })).into_response()
        }
        Err(refused) => error(StatusCode::BAD_REQUEST, refused),
    }
}

/// `POST /sim/fail/{lease}` (the simulator's own route): a ready lease's container exits for
/// good; the backend reports it failed on the lease's callback URL, unless `?callback=false`
/// (the failure is then only in its listings until this is asked again).
async fn fail(State(sim): State<Sim>, Path(lease): Path<Uuid>, request: Request) -> Response {
    let silent = request.uri().query().is_some_and(|query| query.contains("callback=false"));
    let callback_url = {
        let mut provisions = sim.provisions();
        match provisions.get_mut(&lease) {
            Some(provision) if matches!(provision.status, "ready" | "failed") => {
                provision.status = "failed";
                provision.request.callback_url.clone()
            }
            _ => return error(StatusCode::NOT_FOUND, "no running lease"),
        }
    };
    if silent {
        return StatusCode::ACCEPTED.into_response();
    }
    let payload = CallbackPayload {
        lease_uuid: lease.to_string(),
        status: "failed".into(),
        error: Some("container exited".into()),
        backend: Some(sim.name.clone()),
        retained: false,
        maintenance_id: None,
        maintenance_admitted_at: None,
        rolled_back: None,
    };
    tokio::spawn(async move { send_callback(&sim, &callback_url, &payload).await });
    StatusCode::ACCEPTED.into_response()
}

/// `POST /sim/sweep/{lease}` (the simulator's own route): the backend's own retention sweep
/// destroys the lease's retained data, as fred's backends do when its grace ends.
async fn sweep(State(sim): State<Sim>, Path(lease): Path<Uuid>) -> Response {
    let mut provisions = sim.provisions();
    match provisions.get(&lease) {
        Some(provision) if provision.status == "retained" => {
            provisions.remove(&lease);
            StatusCode::NO_CONTENT.into_response()
        }
        _ => error(StatusCode::NOT_FOUND, "no retained data"),
    }
}

/// `GET /provisions/{lease}`: one record, or 404.
async fn provision_info(State(sim): State<Sim>, Path(lease): Path<Uuid>) -> Response {
    match sim.provisions().get(&lease) {
        Some(provision) => (StatusCode::OK, axum::Json(info_of(&sim, provision))).into_response(),
        None => error(StatusCode::NOT_FOUND, "lease not provisioned"),
    }
}

/// `GET /sim/requests`: how many requests each route received (the simulator's own route).
async fn received(State(sim): State<Sim>) -> Response {
    let received = sim.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    axum::Json(received).into_response()
}

fn page(provisions: Vec<ProvisionInfo>, next: Option<String>) -> Response {
    (StatusCode::OK, axum::Json(ProvisionsPage { provisions, next })).into_response()
}

fn info_of(sim: &Sim, provision: &Provision) -> ProvisionInfo {
    let request = &provision.request;
    ProvisionInfo {
        lease_uuid: request.lease_uuid,
        provider_uuid: request.provider_uuid,
        status: provision.status.to_string(),
        created_at: provision.created_at,
        fail_count: 0,
        reason: None,
        message: None,
        retained_until: None,
        // An older or third-party backend names no tenant: its listing is not identity-bearing.
        tenant: (!sim.has(Fault::AnonymousInventory)).then(|| request.tenant.clone()),
        partition: Some(sim.name.clone()),
        image: None,
        sku: request.items.first().map(|item| item.sku.clone()),
        quantity: request.items.first().map_or(0, |item| item.quantity),
        items: Some(request.items.clone()),
        service_images: None,
        lifecycle_generation: None,
        // Only with `--fault exhausted-budget`: a failed provision has no retries left.
        terminal_budget: (sim.has(Fault::ExhaustedBudget) && provision.status == "failed")
            .then(|| TerminalBudget { verdict: "exhausted".into(), consecutive_failures: 1 }),
    }
}

async fn stats(State(sim): State<Sim>) -> Response {
    sim.received("stats");
    if sim.has(Fault::NoStats) {
        return error(StatusCode::NOT_FOUND, "not found");
    }
    let ready = sim.provisions().values().filter(|p| p.status == "ready").count();
    let allocated = sim.allocated_cpu_cores.unwrap_or(ready as f64);
    let body = json!({
        "total_cpu_cores": 64.0, "allocated_cpu_cores": allocated,
        "available_cpu_cores": 64.0 - allocated, "active_containers": ready,
    });
    axum::Json(body).into_response()
}

/// The request target (path and query) of an absolute URL: what a callback's signature
/// covers.
mod url {
    pub fn target_of(url: &str) -> String {
        let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
        match after_scheme.find('/') {
            Some(slash) => after_scheme[slash..].to_string(),
            None => "/".to_string(),
        }
    }
}
