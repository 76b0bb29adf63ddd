//! The node-agent protocol: the routes node agents on rented machines dial out to, as
//! mercator's agent speaks them (`docs/mercator-protocol.md` §2). A node enrolls with its
//! bootstrap's single-use token (or, to resume, its last session token) and is given a
//! session token, a node credential scoped to its node, rental, generation and fencing
//! token; every other route takes that credential as `Bearer`, and every report it carries is
//! fenced by the node's stream (a session a later enrollment closed is `409`).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/node-agent/enroll` | enroll (no bearer): `401 ENROLLMENT_REFUSED` whatever the node got wrong, `500 INTERNAL` when Leasehold failed |
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
    EnrollRequest, EnrollResponse, EventKind, EventWire, EventsRequest, ReconciliationRequest,
    RenewResponse, ResultRequest,
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

    /// A report refused as `code` (`EVENTS_REJECTED`, `RESULT_REJECTED`, ...): an unknown
    /// node or session 401; a closed session 409 (the node must enroll again), a lost or
    /// retired node 409 `SESSION_REFUSED`; anything the node sent that cannot be recorded
    /// (an unknown operation or run, a contradicting report) 400; a failure of Leasehold's
    /// own 500 with no detail.
    fn report(code: &'static str, error: CommandError<NodeError>) -> Self {
        match &error {
            CommandError::Refused(NodeError::EnrollmentRefused) => {
                Self::new(StatusCode::UNAUTHORIZED, code, "no such node for this session")
            }
            CommandError::Refused(NodeError::Fenced { .. }) => {
                Self::new(StatusCode::CONFLICT, code, error.to_string())
            }
            CommandError::Refused(NodeError::NotReady { .. } | NodeError::Retired) => {
                Self::new(StatusCode::CONFLICT, "SESSION_REFUSED", error.to_string())
            }
            _ => {
                let error = ApiError::from(error);
                if matches!(error.code, Code::Internal | Code::Unavailable) {
                    Self::internal()
                } else {
                    Self::new(StatusCode::BAD_REQUEST, code, error.message)
                }
            }
        }
    }

    /// Leasehold's own failure: the node tries again later.
    fn internal() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "try again")
    }

    /// Whether the node sent something that will never be recorded (it is skipped, not
    /// retried).
    fn is_permanent(&self) -> bool {
        self.status == StatusCode::BAD_REQUEST
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
    let generation = request.generation;
    // Operators are told which node was turned away, never what it presented nor why.
    let refused = || {
        tracing::info!(node = %node.0, rental = %rental.0, generation, "an enrollment was refused");
        Refusal::enrollment()
    };
    let token = request.enrollment_token.as_str();
    let presented = if token.starts_with("lhn1.") {
        // A resume: the credential must be this node's, for the rental and generation named.
        let session = nodes.verify(token).map_err(|_| refused())?;
        if (session.rental, session.generation) != (rental, generation) {
            return Err(refused());
        }
        Presented::Credential(token)
    } else {
        Presented::Token { token, rental, generation }
    };
    let enrollment = match nodes.enroll(node, presented, (version, facts)).await {
        Ok(enrollment) => enrollment,
        // Whatever refused it, the one answer; only Leasehold's own failure is told apart
        // (the node tries again), and it says nothing of the token.
        Err(error @ (CommandError::Store(_) | CommandError::RetriesExhausted { .. })) => {
            tracing::warn!(error = %error, "an enrollment failed");
            return Err(Refusal::internal());
        }
        Err(_) => return Err(refused()),
    };
    tracing::info!(
        node = %node.0,
        fencing_token = enrollment.fencing_token,
        resumed = enrollment.duplicate,
        "a node enrolled"
    );
    Ok(EnrollResponse {
        node_id: node.0,
        session_token: enrollment.credential,
        session_expires: enrollment.session_expires,
        fencing_token: enrollment.fencing_token,
        lease_expires: enrollment.lease_expires,
        duplicate: enrollment.duplicate,
    })
}

/// `POST /v1/node-agent/{node}/events`: each event recorded under a digest of what it says,
/// so a replayed spool (in this session or a later one) is the recorded event, and an id the
/// node reused for something else is a new one. Of a batch's heartbeats only the last is
/// recorded (each renews the lease; the last facts are the node's). An event that can never
/// be recorded (malformed, another node's, a look at an attempt that is not this node's) is
/// skipped and named in the answer's `skipped`, so it cannot stall the node's spool; a
/// closed session or a lost node refuses the batch (the events after it stay the node's).
async fn events(
    State(http): State<Http>,
    Path(node): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let session = session_of(&http, &headers, &node)?;
        let request: EventsRequest = decoded(body)?;
        let last_beat = request.events.iter().rposition(|event| event["kind"] == "heartbeat");
        let mut skipped = Vec::new();
        for (index, event) in request.events.into_iter().enumerate() {
            let is_beat = event["kind"] == "heartbeat";
            if is_beat && Some(index) != last_beat {
                continue;
            }
            match record_event(&http, &session, event).await {
                Ok(()) => {}
                Err(refusal) if refusal.is_permanent() => skipped.push(json!({
                    "index": index, "code": refusal.code, "message": refusal.message,
                })),
                Err(refusal) => return Err(refusal),
            }
        }
        Ok(json!({ "skipped": skipped }))
    };
    match run.await {
        Ok(answer) => (StatusCode::ACCEPTED, axum::Json(answer)).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// Records one event of a batch.
async fn record_event(
    http: &Http,
    session: &NodeSession,
    event: serde_json::Value,
) -> Result<(), Refusal> {
    const CODE: &str = "EVENTS_REJECTED";
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, CODE, message);
    let key = format!("event-{}", key_of(event.to_string().as_bytes()));
    let event: EventWire = serde_json::from_value(event).map_err(|error| bad(error.to_string()))?;
    if event.id.is_empty() {
        return Err(bad("an event needs its id (a replayed spool is deduplicated by it)".into()));
    }
    if event.node_id != session.node.0 {
        return Err(bad("an event of another node".into()));
    }
    let nodes = &http.state.inner.rented.nodes;
    let refused = |error| Refusal::report(CODE, error);
    match (event.kind, event.facts, event.workload) {
        (EventKind::Heartbeat, facts, None) => {
            let facts = facts.map(wire::Facts::checked).transpose().map_err(|e| bad(e.message))?;
            nodes.heartbeat(session, &key, facts).await.map_err(refused)?;
        }
        (EventKind::Workload, None, Some(workload)) => {
            nodes.observe(session, &key, workload.observation()).await.map_err(refused)?;
        }
        _ => {
            return Err(bad(
                "a heartbeat carries facts only, a workload event its workload only".into()
            ));
        }
    }
    Ok(())
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
        // Keyed by what it says: the same answer again (a replay, in any session) is the
        // recorded one; another answer is decided (and fenced, or refused as contradicting).
        let key = format!("result-{}-{}", request.operation_id, request.applied);
        let nodes = &http.state.inner.rented.nodes;
        nodes
            .settle(&session, &key, (operation, result))
            .await
            .map_err(|error| Refusal::report(CODE, error))?;
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
            .map_err(|error| Refusal::report("SESSION_REFUSED", error))?;
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
        let answering = request.lookup_operation_id.map(OperationId);
        let key = format!("reconcile-{}-{}", session.fencing_token, key_of(&body));
        let nodes = &http.state.inner.rented.nodes;
        nodes
            .reconcile(&session, &key, (applied, answering))
            .await
            .map_err(|error| Refusal::report(CODE, error))?;
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
