//! `POST /v1/node-agent/{node}/session`: the node's commands as NDJSON, one
//! `{operation_id, node_id, kind, fencing_token, issued_at, payload}` per line. Every
//! operation still pending under this session's fencing token is sent first (oldest first),
//! then each one ordered from now on, in log order, each once on this stream. One pending
//! from an earlier session is never sent: the node refuses a superseded token without saying
//! whether it applied the operation then, so only its reconciliation settles it (rule 20).
//! The stream ends when the session is closed (a later enrollment), when the node is lost or
//! retired, and when the server stops; the agent then opens another (or enrolls again).

use std::collections::HashSet;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use leasehold_adapters::PgEventStore;
use leasehold_commands::enrollment::NodeSession;
use leasehold_commands::node_service::NodeService;
use leasehold_domain::node::{NodeEvent, NodeOperation, NodeStatus, OperationState};
use leasehold_domain::values::OperationId;
use leasehold_domain::{DomainEvent as _, EventStore as _};

use super::wire::CommandWire;
use super::{Refusal, session_of};
use crate::http::Http;
use crate::live::feed::{Feed, Scope};

/// What the stream follows of the node's stream: its orders, and what ends the session.
const FOLLOWED: [&str; 4] = ["NodeOperationRequested", "NodeEnrolled", "NodeLost", "NodeRetired"];

/// Opens the node's command stream.
pub(super) async fn open(
    State(http): State<Http>,
    Path(node): Path<String>,
    headers: HeaderMap,
) -> Response {
    match opened(&http, &node, &headers).await {
        Ok(body) => ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn opened(http: &Http, node: &str, headers: &HeaderMap) -> Result<Body, Refusal> {
    let session = session_of(http, headers, node)?;
    let refused = || Refusal::new(StatusCode::UNAUTHORIZED, "SESSION_REFUSED", "session refused");
    let internal = || Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "try again");
    let inner = &http.state.inner;
    // Subscribed to the hub, and the log's head fixed, before the node is read: an order
    // appended after the read is in the feed, one before it in the node's pending list (one
    // in both is sent once).
    let live = inner.hub.subscribe();
    let start = inner.store.head().await.map_err(|_| internal())?;
    let (_, stored) =
        inner.rented.nodes.owned(session.node).await.map_err(|error| match error {
            leasehold_commands::CommandError::NotFound => refused(),
            _ => internal(),
        })?;
    if stored.status != NodeStatus::Ready || stored.fencing_token != session.fencing_token {
        return Err(refused());
    }
    let now = inner.rented.nodes.pipeline().clock().now();
    let pending: Vec<CommandWire> = stored
        .pending()
        .filter(|operation| operation.fencing_token == session.fencing_token)
        .map(|operation| CommandWire::of(session.node.0, operation, now))
        .collect();
    let sent: HashSet<OperationId> =
        pending.iter().map(|command| OperationId(command.operation_id)).collect();
    let scope = Scope {
        stream_ids: vec![session.node.stream_id().as_str().to_owned()],
        event_types: FOLLOWED.iter().map(ToString::to_string).collect(),
        ..Scope::default()
    };
    let feed = Feed::new(inner.store.clone(), live, scope, start);
    let first = futures_util::stream::iter(pending);
    let followed = Followed { nodes: inner.rented.nodes.clone(), session, sent };
    let later = futures_util::stream::unfold(Some((feed, followed)), |state| async move {
        let (mut feed, mut followed) = state?;
        loop {
            let event = feed.next().await.ok().flatten()?;
            let decoded = NodeEvent::from_stored(event.event_type.as_str(), &event.payload).ok()?;
            if let Some(command) = followed.command(decoded).await? {
                return Some((command, Some((feed, followed))));
            }
        }
    });
    let lines = first.chain(later).map(|command| {
        let mut line = serde_json::to_vec(&command).expect("a command serializes");
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    Ok(Body::from_stream(lines))
}

/// What an open stream knows: the session it serves and the operations it sent.
struct Followed {
    nodes: NodeService<PgEventStore>,
    session: NodeSession,
    sent: HashSet<OperationId>,
}

impl Followed {
    /// The line `event` sends: `Some(None)` for none, `None` when the session ended.
    async fn command(&mut self, event: NodeEvent) -> Option<Option<CommandWire>> {
        match event {
            NodeEvent::NodeOperationRequested { operation, fencing_token, order, at } => {
                // Another session's order (one decided under the token before this
                // enrollment) is not this session's to carry.
                if fencing_token != self.session.fencing_token || !self.sent.insert(operation) {
                    return Some(None);
                }
                let ordered = NodeOperation {
                    operation,
                    order,
                    fencing_token,
                    state: OperationState::Pending,
                    reason: None,
                };
                Some(Some(CommandWire::of(self.session.node.0, &ordered, at)))
            }
            // An enrollment, a loss or a retirement: the feed may carry one from before this
            // session's own enrollment (the head was fixed before the node was read), so the
            // node as stored now decides whether this session still holds it.
            _ => {
                let (_, stored) = self.nodes.owned(self.session.node).await.ok()?;
                let holds = stored.status == NodeStatus::Ready
                    && stored.fencing_token == self.session.fencing_token;
                holds.then_some(None)
            }
        }
    }
}
