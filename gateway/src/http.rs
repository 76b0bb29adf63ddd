//! The HTTP surface: `POST /graphql`, the embedded pages (the dashboard at `/`, GraphiQL on
//! `GET /graphql`), `/healthz` and `/readyz`.
//!
//! The body is read and parsed here rather than by async-graphql's extractor so that every
//! refusal (no token, an oversized or malformed body, a batch over the cap) is a GraphQL
//! response with a code from the fixed set, and so that the token is checked before anything
//! executes. Answers are written in the media type the client accepts (`media`).

use async_graphql::{BatchRequest, BatchResponse, Request};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold_domain::Cursor;

use crate::auth::{Principal, Role};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, Code, response_of, with_codes};
use crate::media::{Answer, is_json_body};
use crate::schema::{self, LeaseholdSchema};
use crate::state::AppState;

/// The request extension that asks for read-your-writes: a cursor a mutation returned.
pub const MIN_CURSOR_EXTENSION: &str = "minCursor";

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Http {
    pub(crate) state: AppState,
    pub(crate) schema: LeaseholdSchema,
}

/// The gateway's router; `leasehold serve` and the tests both use it.
pub fn app(state: AppState) -> Router {
    let schema = schema::build(&state);
    let body_max = state.inner.config.body_bytes_max;
    let http = Http { state, schema };
    Router::new()
        .route("/", get(crate::pages::dashboard))
        .route("/assets/{*file}", get(crate::pages::asset))
        .route("/graphql", get(crate::pages::graphiql).post(graphql))
        .route("/graphql/ws", get(crate::ws::upgrade))
        .route("/callbacks/leases/{lease_id}", post(crate::callbacks::unnamed))
        .route(
            "/callbacks/leases/{lease_id}/operations/{operation_id}",
            post(crate::callbacks::operation),
        )
        .route(
            "/callbacks/leases/{lease_id}/maintenance/{maintenance_id}",
            post(crate::callbacks::maintenance),
        )
        .merge(crate::node_agent::routes())
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(crate::metrics::render))
        .fallback(no_such_route)
        .method_not_allowed_fallback(no_such_method)
        .layer(DefaultBodyLimit::max(body_max))
        .route_layer(axum::middleware::from_fn_with_state(http.clone(), crate::metrics::track))
        .with_state(http)
}

/// A path the gateway does not serve: a typed answer, as every other refusal is.
async fn no_such_route() -> Response {
    let body = serde_json::json!({ "code": "NOT_FOUND", "message": "no such route" });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// A method a route does not take.
async fn no_such_method() -> Response {
    let body = serde_json::json!({ "code": "BAD_USER_INPUT", "message": "method not allowed" });
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(http): State<Http>) -> Response {
    match http.state.inner.store.migrations_current().await {
        Ok(true) => (StatusCode::OK, "ready\n").into_response(),
        Ok(false) => {
            (StatusCode::SERVICE_UNAVAILABLE, "migrations are not current\n").into_response()
        }
        Err(error) => {
            tracing::warn!(%error, "readiness check failed");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n").into_response()
        }
    }
}

async fn graphql(
    State(http): State<Http>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let config = &http.state.inner.config;
    let answer = Answer::accepted(&headers);
    let refuse = |status, error| refuse(answer, status, error);
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let message = format!("the request body is over {} bytes", config.body_bytes_max);
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, ApiError::bad_input(message));
        }
        Err(_) => {
            return refuse(StatusCode::BAD_REQUEST, ApiError::bad_input("unreadable body"));
        }
    };
    if !is_json_body(&headers) {
        let message = "the body must be JSON: send `Content-Type: application/json`";
        return refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, ApiError::bad_input(message));
    }
    let authorization = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
    let principal = match http.state.jwt().verify_header(authorization) {
        Ok(principal) => principal,
        Err(error) => return refuse(StatusCode::UNAUTHORIZED, error.into()),
    };
    let batch: BatchRequest = match serde_json::from_slice(&body) {
        Ok(batch) => batch,
        Err(error) => {
            let message = format!("the body is not a GraphQL request: {error}");
            return refuse(StatusCode::BAD_REQUEST, ApiError::bad_input(message));
        }
    };
    let requests = match batch {
        BatchRequest::Single(request) => vec![request],
        BatchRequest::Batch(requests) if requests.len() <= config.batch_max => requests,
        BatchRequest::Batch(requests) => {
            let message = format!(
                "a batch holds at most {} operations, not {}",
                config.batch_max,
                requests.len()
            );
            return refuse(StatusCode::BAD_REQUEST, ApiError::bad_input(message));
        }
    };
    let single = requests.len() == 1 && matches!(body.first(), Some(b'{'));
    let mut responses = Vec::with_capacity(requests.len());
    for request in requests {
        responses.push(execute(&http, &principal, request).await);
    }
    let response = if single {
        BatchResponse::Single(responses.remove(0))
    } else {
        BatchResponse::Batch(responses)
    };
    answer.write(None, &response)
}

/// Runs one operation for `principal`, after waiting for the read models if it asked to.
async fn execute(http: &Http, principal: &Principal, request: Request) -> async_graphql::Response {
    if let Err(error) = read_your_writes(http, principal, &request).await {
        return response_of(error);
    }
    let mut request = request.data(principal.clone());
    if principal.role != Role::Operator {
        request = request.disable_introspection();
    }
    with_codes(http.schema.execute(request).await)
}

/// Waits until the projections reached the `minCursor` extension's cursor, if it is given.
async fn read_your_writes(
    http: &Http,
    principal: &Principal,
    request: &Request,
) -> Result<(), ApiError> {
    let Some(value) = request.extensions.get(MIN_CURSOR_EXTENSION) else {
        return Ok(());
    };
    let field = "extensions.minCursor";
    let async_graphql::Value::String(text) = value else {
        return Err(ApiError::bad_input(format!("{field}: must be a cursor string")));
    };
    let inner = &http.state.inner;
    let scope = principal.cursor_scope();
    let text: String = inner.cursors.open(CursorKind::Log, &scope, field, text)?;
    let cursor: Cursor =
        text.parse().map_err(|_| ApiError::bad_input(format!("{field}: malformed")))?;
    let reads = crate::reads::reads_of(&request.query);
    let wait = inner.config.consistency_wait;
    let stores = (&inner.store, &inner.read_models);
    inner.projections.reached(stores, cursor, wait, &reads).await
}

fn refuse(answer: Answer, status: StatusCode, error: ApiError) -> Response {
    let unauthenticated = error.code == Code::Unauthenticated;
    let mut response = answer.write(Some(status), &BatchResponse::Single(response_of(error)));
    if unauthenticated {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("a valid header"));
    }
    response
}

/// The kernel send buffer of each connection.
const SEND_BUFFER_BYTES: usize = 256 * 1024;

/// How long a stop waits for WebSockets to close.
const SOCKETS_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves [`app`] on `listener` until `shutdown` completes, then lets requests in flight
/// finish and closes every WebSocket with 1012 (axum's graceful shutdown does not wait for
/// upgraded connections, so they are counted and awaited here).
///
/// # Errors
/// When accepting connections fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopper = state.clone();
    let shutdown = async move {
        shutdown.await;
        stopper.stop();
    };
    let sockets = state.inner.sockets.clone();
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
        // Without TCP_NODELAY, small WebSocket frames wait on the peer's delayed ACK (about
        // 40 ms on Linux) whenever a previous frame is still unacknowledged.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        // A bounded send buffer per connection: a client that stops reading is noticed after
        // this much (then closed with 1013), not after the kernel's 4 MiB default maximum,
        // and a thousand stuck sockets cannot hold gigabytes.
        let socket = socket2::SockRef::from(&*stream);
        if let Err(error) = socket.set_send_buffer_size(SEND_BUFFER_BYTES) {
            tracing::debug!(%error, "SO_SNDBUF not set");
        }
    });
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown).await?;
    if tokio::time::timeout(SOCKETS_CLOSE_WAIT, sockets.closed()).await.is_err() {
        tracing::warn!(open = sockets.count(), "WebSockets still open at shutdown");
    }
    Ok(())
}
