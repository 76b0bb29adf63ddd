//! The node-agent protocol: the routes node agents on rented machines dial out to, as
//! mercator's agent speaks them (`docs/mercator-protocol.md` §2). A node enrolls with its
//! bootstrap's single-use token (or, to resume, its last session token) and is given a
//! session token, a node credential scoped to its node, rental, generation and fencing
//! token; every other route takes that credential as `Bearer`, and every report it carries is
//! fenced by the node's stream (a session a later enrollment closed is `409`).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/node-agent/enroll` | enroll (no bearer): `401 ENROLLMENT_REFUSED` whatever failed |
//! | `POST /v1/node-agent/{node}/session` | the NDJSON stream of the node's commands |
//! | `POST /v1/node-agent/{node}/events` | heartbeats (with facts) and workload looks |
//! | `POST /v1/node-agent/{node}/results` | an operation applied or refused |
//! | `POST /v1/node-agent/{node}/renew` | a new session token, same fencing token (Leasehold's) |
//! | `POST /v1/node-agent/{node}/reconciliation` | the operations it applied (Leasehold's) |
//!
//! Errors are `{"code", "message"}`; a message never holds a token, driver text or why an
//! enrollment was refused. Bodies are decoded strictly and capped by the gateway's body limit.

mod session;
mod wire;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use leasehold_commands::CommandError;
use leasehold_commands::enrollment::NodeSession;
use leasehold_commands::node_service::Presented;
use leasehold_domain::node::{NodeError, NodeId, OperationResult};
use leasehold_domain::rental::RentalId;
use leasehold_domain::values::{OperationId, Reason};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use crate::errors::{ApiError, Code};
use crate::http::Http;
use wire::{
    EnrollRequest, EnrollResponse, EventKind, EventsRequest, ReconciliationRequest, RenewResponse,
    ResultRequest,
};

/// The node-agent routes, merged into the gateway's router.
pub(crate) fn routes() -> Router<Http> {
    Router::new()
        .route("/v1/node-agent/enroll", post(enroll))
        .route("/v1/node-agent/{node}/session", post(session::open))
        .route("/v1/node-agent/{node}/events", post(events))
        .route("/v1/node-agent/{node}/results", post(results))
        .route("/v1/node-agent/{node}/renew", post(renew))
        .route("/v1/node-agent/{node}/reconciliation", post(reconciliation))
}

/// A refusal on the wire: its status, mercator's code and a message for the node.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    /// The one answer to any failed enrollment: it says nothing of why.
    fn enrollment() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "ENROLLMENT_REFUSED", "enrollment refused")
    }

    /// A report refused as `code` (`EVENTS_REJECTED`, `RESULT_REJECTED`): an unknown node
    /// or session 401, a closed session 409, anything else the node sent 400; a failure of
    /// Leasehold's own 500 with no detail.
    fn report(code: &'static str, error: &ApiError) -> Self {
        let status = match error.code {
            Code::NotFound | Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Fenced | Code::Conflict | Code::IdempotencyConflict => StatusCode::CONFLICT,
            Code::Internal | Code::Unavailable => {
                return Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "try again");
            }
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, code, error.message.clone())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = json!({ "code": self.code, "message": self.message });
        (self.status, axum::Json(body)).into_response()
    }
}

/// A body, or `413 BODY_TOO_LARGE` / `400 INVALID_REQUEST`.
fn readable(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Refusal> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, "BODY_TOO_LARGE", "the body is too large")
        } else {
            Refusal::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "the body cannot be read")
        }
    })
}

/// A body, decoded strictly (`400 INVALID_REQUEST` naming what is wrong).
fn decoded<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Refusal> {
    let body = readable(body)?;
    serde_json::from_slice(&body).map_err(|error| {
        Refusal::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", error.to_string())
    })
}

/// The session a request's bearer credential names, for the node of its path: `401
/// SESSION_REQUIRED` without one, `401 SESSION_REFUSED` for one that is not valid now or is
/// another node's.
fn session_of(http: &Http, headers: &HeaderMap, node: &str) -> Result<NodeSession, Refusal> {
    let refused = || Refusal::new(StatusCode::UNAUTHORIZED, "SESSION_REFUSED", "session refused");
    let value = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
    let credential = value.and_then(|value| value.strip_prefix("Bearer ")).map(str::trim);
    let Some(credential) = credential.filter(|credential| !credential.is_empty()) else {
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "SESSION_REQUIRED",
            "a bearer session token is required",
        ));
    };
    let session = http.state.inner.rented.nodes.session(credential).map_err(|_| refused())?;
    let named = Uuid::parse_str(node).map_err(|_| refused())?;
    if session.node.0 != named {
        return Err(refused());
    }
    Ok(session)
}

/// `POST /v1/node-agent/enroll`.
async fn enroll(State(http): State<Http>, body: Result<Bytes, BytesRejection>) -> Response {
    match enrolled(&http, body).await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn enrolled(
    http: &Http,
    body: Result<Bytes, BytesRejection>,
) -> Result<EnrollResponse, Refusal> {
    let request: EnrollRequest = decoded(body)?;
    let bad =
        |error: ApiError| Refusal::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", error.message);
    let facts = request.facts.checked().map_err(bad)?;
    let version = wire::agent_version(request.agent_version).map_err(bad)?;
    let (node, rental) = (NodeId(request.node_id), RentalId(request.rental_id));
    let nodes = &http.state.inner.rented.nodes;
    let token = request.enrollment_token.as_str();
    let presented = if token.starts_with("lhn1.") {
        // A resume: the credential must be this node's, for the rental and generation named.
        let session = nodes.verify(token).map_err(|_| Refusal::enrollment())?;
        if (session.rental, session.generation) != (rental, request.generation) {
            return Err(Refusal::enrollment());
        }
        Presented::Credential(token)
    } else {
        Presented::Token { token, rental, generation: request.generation }
    };
    let enrollment = match nodes.enroll(node, presented, (version, facts)).await {
        Ok(enrollment) => enrollment,
        Err(CommandError::Refused(NodeError::EnrollmentRefused) | CommandError::NotFound) => {
            return Err(Refusal::enrollment());
        }
        Err(error) => return Err(Refusal::report("ENROLLMENT_REFUSED", &error.into())),
    };
    Ok(EnrollResponse {
        node_id: node.0,
        session_token: enrollment.credential,
        session_expires: enrollment.session_expires,
        fencing_token: enrollment.fencing_token,
        lease_expires: enrollment.lease_expires,
        duplicate: enrollment.duplicate,
    })
}

/// `POST /v1/node-agent/{node}/events`: each event recorded under its own id, so a replayed
/// spool is deduplicated; the first refused one stops the batch (those before it stand).
async fn events(
    State(http): State<Http>,
    Path(node): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    const CODE: &str = "EVENTS_REJECTED";
    let run = async {
        let session = session_of(&http, &headers, &node)?;
        let request: EventsRequest = decoded(body)?;
        let nodes = &http.state.inner.rented.nodes;
        let refuse = |error: ApiError| Refusal::report(CODE, &error);
        for event in request.events {
            if event.node_id != session.node.0 {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    CODE,
                    "an event of another node",
                ));
            }
            let key = format!("event-{}", key_of(event.id.as_bytes()));
            match (event.kind, event.facts, event.workload) {
                (EventKind::Heartbeat, facts, None) => {
                    let facts = facts.map(wire::Facts::checked).transpose().map_err(refuse)?;
                    nodes.heartbeat(&session, &key, facts).await.map_err(|e| refuse(e.into()))?;
                }
                (EventKind::Workload, None, Some(workload)) => {
                    let observation = workload.observation();
                    nodes
                        .observe(&session, &key, observation)
                        .await
                        .map_err(|e| refuse(e.into()))?;
                }
                _ => {
                    return Err(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        CODE,
                        "a heartbeat carries facts only, a workload event its workload only",
                    ));
                }
            }
        }
        Ok(())
    };
    accepted(run.await)
}

/// `POST /v1/node-agent/{node}/results`.
async fn results(
    State(http): State<Http>,
    Path(node): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    const CODE: &str = "RESULT_REJECTED";
    let run = async {
        let session = session_of(&http, &headers, &node)?;
        let request: ResultRequest = decoded(body)?;
        let result = if request.applied {
            OperationResult::Applied
        } else {
            // The node's failure text is its own (it may print anything): the refusal is
            // recorded under a fixed reason.
            OperationResult::Refused {
                reason: Reason::parse("reason", "NodeRefused").expect("valid"),
            }
        };
        let operation = OperationId(request.operation_id);
        let key = format!("result-{}", request.operation_id);
        let nodes = &http.state.inner.rented.nodes;
        nodes
            .settle(&session, &key, (operation, result))
            .await
            .map_err(|error| Refusal::report(CODE, &error.into()))?;
        Ok(())
    };
    accepted(run.await)
}

/// `POST /v1/node-agent/{node}/renew`.
async fn renew(State(http): State<Http>, Path(node): Path<String>, headers: HeaderMap) -> Response {
    let run = async {
        let session = session_of(&http, &headers, &node)?;
        let key = format!("renew-{}", Uuid::now_v7());
        let nodes = &http.state.inner.rented.nodes;
        let (credential, expires) = nodes
            .renew(&session, &key)
            .await
            .map_err(|error| Refusal::report("SESSION_REFUSED", &error.into()))?;
        Ok::<_, Refusal>(RenewResponse { session_token: credential, session_expires: expires })
    };
    match run.await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// `POST /v1/node-agent/{node}/reconciliation`.
async fn reconciliation(
    State(http): State<Http>,
    Path(node): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    const CODE: &str = "RECONCILIATION_REJECTED";
    let run = async {
        let session = session_of(&http, &headers, &node)?;
        let body = readable(body)?;
        let request: ReconciliationRequest = decoded(Ok(body.clone()))?;
        let applied = request.applied_operation_ids.into_iter().map(OperationId).collect();
        let key = format!("reconcile-{}-{}", session.fencing_token, key_of(&body));
        let nodes = &http.state.inner.rented.nodes;
        nodes
            .reconcile(&session, &key, applied)
            .await
            .map_err(|error| Refusal::report(CODE, &error.into()))?;
        Ok(())
    };
    accepted(run.await)
}

fn accepted(done: Result<(), Refusal>) -> Response {
    match done {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// A short digest of what the node sent, as an operation key's tail: the key is the same for
/// the same input, and never holds the node's own text.
fn key_of(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..20])
}
