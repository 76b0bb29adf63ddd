//! Backend callbacks. Every callback URL names the operation it reports on, because a backend
//! keeps the last callback URL it was given per lease and reports everything there:
//!
//! - `POST /callbacks/leases/{lease_id}/operations/{operation_id}` reports on a provision or a
//!   restore: `success` (provisioned), `failed` (the provision failed, or the running lease
//!   did), `deprovisioned` (released).
//! - `POST /callbacks/leases/{lease_id}/maintenance/{maintenance_id}` completes a restart or an
//!   update when the body carries `maintenance_admitted_at`, or, without it (a backend that
//!   predates stamps: every public fred backend), when that maintenance is the one pending;
//!   otherwise (a later observation on the URL the backend kept) it reports on the lease as
//!   above, the maintenance id being the operation.
//!
//! A valid callback becomes the same fenced command as the agent mutation: a report naming an
//! operation older than the lease's current one is `FENCED` (409), so a late report of one
//! provisioning cycle never settles the next one.
//!
//! Authentication (DOMAIN.md §3 rules 5 and 6): the backends' own `X-Fred-Signature:
//! t=<unix seconds>,sha256=<hex>`, the HMAC-SHA256 of
//! `t "\n" METHOD "\n" request-URI "\n" hex(sha256(body))` under the callback secret
//! (`leasehold_adapters::backends`), compared in constant time; a signature more than 5 minutes
//! old or 1 minute ahead is refused. The secret is the lease's backend's own (from the backends
//! file) when it has one, else the callback secret: one backend's secret never verifies a
//! callback on another's lease.
//! Authority — which lease, which operation — comes from the signed URL only: the body's
//! `operation_id`, `lifecycle_id` and `backend` are never read, and a body naming another
//! lease is refused. A redelivery of the same callback (same URL and body) is a duplicate; the
//! same report for a new operation has a new URL, so it is not.

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use leasehold_adapters::backends::SigningSecret;
use leasehold_commands::CommandError;
use leasehold_commands::lease_input;
use leasehold_commands::lease_service::{Caller, LeaseOutcome};
use leasehold_domain::lease::{
    LeaseCommand, LeaseId, MaintenanceId, MaintenanceKind, MaintenanceOutcome, OperationId,
};
use leasehold_domain::{Actor, KeyNamespace};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::auth::Role;
use crate::errors::{ApiError, Code};
use crate::http::Http;

/// The header carrying `t=<unix seconds>,sha256=<hex HMAC>` (the backends' protocol).
pub use leasehold_adapters::backends::SIGNATURE_HEADER;

/// What a failed operation tells the tenant when the backend's error is operator-only.
const FAILED_MESSAGE: &str = "the backend reported a failure";

/// The secret backends sign callbacks with. Its `Debug` never shows it.
#[derive(Debug, Clone)]
pub struct CallbackSecret(SigningSecret);

impl CallbackSecret {
    /// A secret of at least 32 bytes (surrounding whitespace cut).
    ///
    /// # Errors
    /// [`crate::auth::AuthError::WeakSecret`] when shorter.
    pub fn new(bytes: &[u8]) -> Result<Self, crate::auth::AuthError> {
        SigningSecret::new(bytes).map(Self).map_err(|_| crate::auth::AuthError::WeakSecret)
    }

    /// A backend's own secret, already checked.
    pub(crate) fn of(secret: SigningSecret) -> Self {
        Self(secret)
    }

    /// The `X-Fred-Signature` value for a request (what a backend sends).
    pub fn sign(&self, timestamp: i64, method: &str, uri: &str, body: &[u8]) -> String {
        self.0.sign(timestamp, method, uri, body)
    }

    /// Whether the headers sign this request now.
    fn verify(
        &self,
        headers: &HeaderMap,
        method: &Method,
        uri: &Uri,
        body: &[u8],
    ) -> Result<(), ApiError> {
        let header = headers.get(SIGNATURE_HEADER).and_then(|value| value.to_str().ok());
        let target = uri.path_and_query().map_or(uri.path(), |target| target.as_str());
        self.0
            .verify(header, (method.as_str(), target, body), Utc::now())
            .map_err(|why| ApiError::new(Code::Unauthenticated, format!("callback refused: {why}")))
    }
}

/// The completion payload of the lease backend document (fields not listed are ignored,
/// notably `operation_id`, `lifecycle_id` and `backend`: they carry no authority here).
#[derive(Debug, Deserialize)]
struct CallbackPayload {
    lease_uuid: Option<String>,
    status: CallbackStatus,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    maintenance_admitted_at: Option<String>,
    #[serde(default)]
    retained: bool,
    /// Leasehold's extension: whether a failed update was rolled back to the release that ran
    /// before (absent: a restart was, an update was not, as fred's backends do).
    #[serde(default)]
    rolled_back: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum CallbackStatus {
    Success,
    Failed,
    Deprovisioned,
}

/// Which operation a callback URL names.
#[derive(Debug, Clone, Copy)]
enum Named {
    /// `/operations/{id}`: a provision or a restore.
    Operation,
    /// `/maintenance/{id}`: a restart or an update.
    Maintenance,
}

/// `POST /callbacks/leases/{lease_id}`: the URL of an older protocol, which names no
/// operation. Refused, with the URL to use.
pub(crate) async fn unnamed() -> Response {
    answer(Err(ApiError::new(
        Code::NotFound,
        "a callback URL names its operation: /callbacks/leases/{lease_id}/operations/{operation_id}",
    )))
}

/// `POST /callbacks/leases/{lease_id}/operations/{operation_id}`.
pub(crate) async fn operation(
    State(http): State<Http>,
    ids: Result<Path<(String, String)>, PathRejection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(Path((lease, operation))) = ids else { return undecodable_ids() };
    let named = (Named::Operation, operation.as_str());
    answer(handle(&http, &lease, named, &method, &uri, &headers, &body).await)
}

/// `POST /callbacks/leases/{lease_id}/maintenance/{maintenance_id}`.
pub(crate) async fn maintenance(
    State(http): State<Http>,
    ids: Result<Path<(String, String)>, PathRejection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(Path((lease, maintenance))) = ids else { return undecodable_ids() };
    let named = (Named::Maintenance, maintenance.as_str());
    answer(handle(&http, &lease, named, &method, &uri, &headers, &body).await)
}

/// A callback URL whose ids do not decode (percent-encoded bytes that are not UTF-8): refused
/// as the gateway refuses any bad input, not with the router's plain text.
fn undecodable_ids() -> Response {
    answer(Err(ApiError::bad_input("the callback URL's ids are not UUIDs")))
}

async fn handle(
    http: &Http,
    lease: &str,
    (named, operation): (Named, &str),
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<serde_json::Value, ApiError> {
    let inner = &http.state.inner;
    let global = inner.callback_secret.as_ref().ok_or_else(|| {
        ApiError::new(Code::NotFound, "callbacks are not enabled (no callback secret)")
    })?;
    let lease = LeaseId(parse_uuid("lease id", lease)?);
    let operation = parse_uuid("operation id", operation)?;
    // The lease's backend signs with its own secret when the backends file names it; a lease
    // that does not exist (or is on another backend) is verified with the callback secret,
    // so a signature check answers the same whether the lease exists or not.
    let work = match inner.leases.current_work(&caller(), lease).await {
        Ok(work) => Some(work),
        Err(CommandError::NotFound) => None,
        // Never fall back to the shared secret because the lease could not be read.
        Err(error) => return Err(error.into()),
    };
    let backend = work.as_ref().and_then(|work| work.backend.as_ref());
    let secret =
        backend.and_then(|name| inner.backend_secrets.get(name.as_str())).unwrap_or(global);
    secret.verify(headers, method, uri, body)?;
    let payload: CallbackPayload = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_input(format!("not a callback payload: {error}")))?;
    if payload
        .lease_uuid
        .as_deref()
        .is_some_and(|named| Uuid::parse_str(named).ok() != Some(lease.0))
    {
        return Err(ApiError::bad_input("the body names another lease than the signed URL"));
    }
    // On a maintenance URL, what is pending decides how the report reads: the pending
    // maintenance's kind (a failed restart was rolled back), and whether an unstamped report
    // is its completion.
    let work = work.filter(|_| matches!(named, Named::Maintenance));
    let pending = work.as_ref().and_then(|work| work.maintenance.zip(work.maintenance_kind));
    let pending = pending.filter(|((id, _), _)| id.0 == operation).map(|(_, kind)| kind);
    let command = command_of(&payload, (named, pending), operation)?;
    // Redeliveries of one callback carry the same URL and body: the same operation key.
    let target = uri.path_and_query().map_or(uri.path(), |target| target.as_str());
    let mut digest = Sha256::new();
    digest.update(target.as_bytes());
    digest.update(b"\n");
    digest.update(body);
    let operation_key = format!("callback-{}", &hex::encode(digest.finalize())[..40]);
    let outcome = match inner.leases.for_owner(&caller(), &operation_key, lease, command).await {
        Ok(LeaseOutcome { outcome, .. }) => outcome,
        // The key is the URL and body: taken means this very callback was accepted before.
        // Read now, on a moved-on lease, it may stand for another command (a resent failed
        // completion, once nothing is pending, reads as a report); it is a duplicate all the
        // same, never a second report.
        Err(CommandError::IdempotencyConflict) => {
            return Ok(json!({
                "streamId": lease.stream_id().as_str(),
                "duplicate": true,
                "events": [],
            }));
        }
        Err(error) => return Err(error.into()),
    };
    Ok(json!({
        "streamId": outcome.stream_id.as_str(),
        "version": outcome.version,
        "duplicate": outcome.duplicate,
        "events": outcome.event_types,
    }))
}

/// Callbacks have a key namespace of their own: no tenant, agent or operator can take a key a
/// callback will use.
fn caller() -> Caller {
    Caller {
        actor: Actor { subject: "backend-callback".into(), role: Role::Agent.as_str().into() },
        tenant: None,
        provider: None,
        namespace: Some(KeyNamespace::callback()),
    }
}

/// The command a callback stands for. On a maintenance URL, success or failure completes the
/// maintenance when the body echoes its stamp, or, without one (a backend that predates
/// stamps), when that maintenance is the one pending; otherwise it reports on the lease.
fn command_of(
    payload: &CallbackPayload,
    (named, pending): (Named, Option<MaintenanceKind>),
    id: Uuid,
) -> Result<LeaseCommand, ApiError> {
    let error = payload.error.as_deref().unwrap_or_default();
    let bad = |error: leasehold_domain::lease::FieldError| ApiError::bad_input(error.to_string());
    let completion = match (named, payload.status, payload.maintenance_admitted_at.as_deref()) {
        (Named::Maintenance, CallbackStatus::Success | CallbackStatus::Failed, Some(stamp)) => {
            Some(Some(stamp))
        }
        (Named::Maintenance, CallbackStatus::Success | CallbackStatus::Failed, None)
            if pending.is_some() =>
        {
            Some(None)
        }
        _ => None,
    };
    let operation = OperationId(id);
    Ok(match (completion, payload.status) {
        (Some(admitted), _) => {
            let maintenance_id = MaintenanceId(id);
            let admitted_at = admitted
                .map(|stamp| {
                    DateTime::parse_from_rfc3339(stamp)
                        .map(|at| at.with_timezone(&Utc))
                        .map_err(|_| ApiError::bad_input("maintenance_admitted_at: not RFC 3339"))
                })
                .transpose()?;
            // A stamped completion of a maintenance no longer pending is fenced or a repeat:
            // its kind only shapes an outcome that is then refused or ignored.
            let kind = pending.unwrap_or(MaintenanceKind::Update);
            let outcome = match payload.status {
                CallbackStatus::Success => MaintenanceOutcome::Succeeded,
                _ => lease_input::failed_maintenance(kind, payload.rolled_back, Some(error)),
            };
            LeaseCommand::CompleteMaintenance { maintenance_id, admitted_at, outcome }
        }
        (None, CallbackStatus::Deprovisioned) => {
            LeaseCommand::ConfirmDeprovisioned { retained: payload.retained }
        }
        (None, CallbackStatus::Success) => LeaseCommand::ReportProvisioned { operation },
        (None, CallbackStatus::Failed) => {
            lease_input::report_failed(operation, None, FAILED_MESSAGE, error).map_err(bad)?
        }
    })
}

fn parse_uuid(what: &str, text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| ApiError::bad_input(format!("{what}: not a UUID")))
}

/// A JSON answer: the outcome, or `{code, message}` with the matching HTTP status.
fn answer(result: Result<serde_json::Value, ApiError>) -> Response {
    match result {
        Ok(outcome) => (StatusCode::OK, axum::Json(outcome)).into_response(),
        Err(error) => {
            let body = json!({ "code": error.code.as_str(), "message": error.message });
            (error.code.http_status(), axum::Json(body)).into_response()
        }
    }
}
