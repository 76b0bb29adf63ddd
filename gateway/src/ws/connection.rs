//! One WebSocket, from `connection_init` to close: authenticates the init payload, runs each
//! operation as a stream, and keeps the protocol's promises that async-graphql's own handler
//! does not (init timeout 4408, subscribe before ack 4401, duplicate id 4409, server pings,
//! 4403 when the token expires, 1012 on shutdown, 1013 for a client that stops reading).
//!
//! Every operation of a socket is polled from one `StreamMap`, which starts each poll at a
//! random stream, so a busy subscription cannot starve the others. A socket has its own task,
//! and a send that does not complete in time closes only that socket; the client then resumes
//! from its last cursor, so nothing is lost.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_graphql::Request;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::{BoxStream, SplitSink, SplitStream};
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_stream::StreamMap;

use super::protocol::{ClientMessage, Close, Protocol, ServerMessage};
use super::render::{Handoff, Selection};
use crate::auth::{Principal, Role};
use crate::errors::{Code, with_codes};
use crate::live::feed::Feed;
use crate::schema::LeaseholdSchema;
use crate::state::AppState;

/// How long the closing frame may take to send.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What an operation delivers.
enum Delivery {
    /// A response async-graphql executed for this operation alone (boxed: the shared
    /// renderings, far more numerous, stay small).
    Response(Box<async_graphql::Response>),
    /// A `next` payload's JSON, rendered once for every socket that shares its selection.
    Rendered(Arc<str>),
}

/// What a socket's operations yield: deliveries, then `None` when the operation is over.
type Operation = BoxStream<'static, Option<Delivery>>;

/// An operation, counted in `/metrics` while it runs.
struct Counted {
    operation: Operation,
    _open: crate::state::Opened,
}

impl futures_util::Stream for Counted {
    type Item = Option<Delivery>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.operation.poll_next_unpin(cx)
    }
}

/// Why a socket ends: a close code and reason, or `None` when the client went away.
type Ending = Option<(Close, &'static str)>;

/// A session only ends by returning its [`Ending`] as an error.
enum Never {}

/// Serves one upgraded socket until it closes.
pub async fn serve(
    socket: WebSocket,
    protocol: Protocol,
    state: AppState,
    schema: LeaseholdSchema,
) {
    let (sink, stream) = socket.split();
    let mut connection = Connection { sink, stream, protocol, state, schema };
    let ending = connection.run().await;
    if let Some((close, reason)) = ending {
        let frame = CloseFrame { code: close.code(), reason: reason.into() };
        let _ = tokio::time::timeout(CLOSE_WAIT, connection.sink.send(Message::Close(Some(frame))))
            .await;
    }
}

struct Connection {
    sink: SplitSink<WebSocket, Message>,
    stream: SplitStream<WebSocket>,
    protocol: Protocol,
    state: AppState,
    schema: LeaseholdSchema,
}

impl Connection {
    async fn run(&mut self) -> Ending {
        let principal = match self.init().await {
            Ok(principal) => principal,
            Err(ending) => return ending,
        };
        if let Err(ending) = self.send(&ServerMessage::Ack).await {
            return ending;
        }
        match self.session(&principal).await {
            Err(ending) => ending,
        }
    }

    /// Waits for `connection_init` and verifies its token.
    async fn init(&mut self) -> Result<Principal, Ending> {
        let config = &self.state.inner.config;
        let deadline = tokio::time::sleep(config.ws_init_wait);
        tokio::pin!(deadline);
        loop {
            let text = tokio::select! {
                () = &mut deadline => return Err(Some((Close::InitTimeout, "connection initialisation timeout"))),
                text = next_text(&mut self.stream) => text.ok_or(None)?,
            };
            match ClientMessage::parse(self.protocol, &text) {
                Ok(ClientMessage::Init(payload)) => {
                    return token_of(&payload)
                        .and_then(|token| self.state.jwt().verify_header(Some(token)).ok())
                        .ok_or(Some((
                            Close::Forbidden,
                            "forbidden: no valid token in connection_init",
                        )));
                }
                Ok(ClientMessage::Ping(payload)) => {
                    self.send(&ServerMessage::Pong(payload)).await?
                }
                Ok(ClientMessage::Subscribe { .. }) => {
                    return Err(Some((Close::Unauthorized, "unauthorized")));
                }
                Ok(ClientMessage::Pong) => {}
                Ok(_) | Err(_) => {
                    return Err(Some((Close::Invalid, "invalid message before connection_init")));
                }
            }
        }
    }

    /// Serves operations until the socket ends.
    async fn session(&mut self, principal: &Principal) -> Result<Never, Ending> {
        let config = self.state.inner.config.clone();
        let mut operations: StreamMap<String, Counted> = StreamMap::new();
        let mut failed: HashSet<String> = HashSet::new();
        let mut stopping = self.state.inner.stopping.subscribe();
        let mut ping = tokio::time::interval_at(
            tokio::time::Instant::now() + config.ws_ping_every,
            config.ws_ping_every,
        );
        let expires_in = (principal.expires_at - chrono::Utc::now()).to_std().unwrap_or_default();
        let expiry = tokio::time::sleep(expires_in);
        tokio::pin!(expiry);
        loop {
            tokio::select! {
                () = stopped(&mut stopping) => return Err(Some((Close::Restarting, "server restarting"))),
                () = &mut expiry => return Err(Some((Close::Forbidden, "token expired"))),
                _ = ping.tick() => self.send(&ServerMessage::KeepAlive).await?,
                Some((id, item)) = operations.next(), if !operations.is_empty() => {
                    self.deliver(id, item, &mut failed).await?;
                }
                text = next_text(&mut self.stream) => {
                    let text = text.ok_or(None)?;
                    match ClientMessage::parse(self.protocol, &text) {
                        Ok(ClientMessage::Subscribe { id, payload }) => {
                            if operations.contains_key(&id) {
                                return Err(Some((Close::DuplicateId, "subscriber for this id already exists")));
                            }
                            if operations.len() >= config.ws_subscriptions_max {
                                let errors = error_list(Code::RateLimited, "too many operations on this socket");
                                self.send(&ServerMessage::Error { id, errors }).await?;
                                continue;
                            }
                            match self.start(principal, payload) {
                                Ok(operation) => {
                                    let counted = Counted { operation, _open: self.state.inner.subscriptions.open() };
                                    operations.insert(id, counted);
                                }
                                Err(errors) => self.send(&ServerMessage::Error { id, errors }).await?,
                            }
                        }
                        Ok(ClientMessage::Complete(id)) => { operations.remove(&id); failed.remove(&id); }
                        Ok(ClientMessage::Ping(payload)) => self.send(&ServerMessage::Pong(payload)).await?,
                        Ok(ClientMessage::Pong) => {}
                        Ok(ClientMessage::Init(_)) => return Err(Some((Close::TooManyInits, "too many initialisation requests"))),
                        Ok(ClientMessage::Terminate) => return Err(Some((Close::Normal, "terminated"))),
                        Err(_) => return Err(Some((Close::Invalid, "invalid message"))),
                    }
                }
            }
        }
    }

    /// An operation's stream, or the errors that prevent it.
    fn start(&self, principal: &Principal, payload: Value) -> Result<Operation, Value> {
        let request: Request = serde_json::from_value(payload)
            .map_err(|_| error_list(Code::BadUserInput, "the payload is not a GraphQL request"))?;
        let mut request = request.data(principal.clone());
        if principal.role != Role::Operator {
            request = request.disable_introspection();
        }
        let setup = (self.schema.clone(), self.state.clone(), principal.clone());
        let deliveries = futures_util::stream::once(deliveries(setup, request)).flatten();
        Ok(deliveries.map(Some).chain(futures_util::stream::once(async { None })).boxed())
    }

    /// Sends an operation's response, or its end. A first response that is only errors (the
    /// operation never ran) is the protocol's `error`, after which no `complete` follows.
    async fn deliver(
        &mut self,
        id: String,
        item: Option<Delivery>,
        failed: &mut HashSet<String>,
    ) -> Result<(), Ending> {
        let response = match item {
            None => {
                if !failed.remove(&id) {
                    self.send(&ServerMessage::Complete(id)).await?;
                }
                return Ok(());
            }
            Some(Delivery::Rendered(payload)) => {
                return self
                    .send_text(ServerMessage::next_text(self.protocol, &id, &payload))
                    .await;
            }
            Some(Delivery::Response(response)) => *response,
        };
        if response.data == async_graphql::Value::Null && !response.errors.is_empty() {
            let errors = serde_json::to_value(&response.errors).unwrap_or_default();
            failed.insert(id.clone());
            return self.send(&ServerMessage::Error { id, errors }).await;
        }
        let payload = serde_json::to_value(&response).unwrap_or_default();
        self.send(&ServerMessage::Next { id, payload }).await
    }

    /// Sends one message; gives up on a client that does not read in time (close 1013: it
    /// reconnects and resumes from its last cursor).
    async fn send(&mut self, message: &ServerMessage) -> Result<(), Ending> {
        self.send_text(message.to_text(self.protocol)).await
    }

    /// Sends one text frame, as [`Self::send`] does.
    async fn send_text(&mut self, text: String) -> Result<(), Ending> {
        let frame = Message::Text(text.into());
        let wait = self.state.inner.config.ws_send_wait;
        match tokio::time::timeout(wait, self.sink.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(None),
            Err(_) => Err(Some((Close::TooSlow, "not reading; resume from your last cursor"))),
        }
    }
}

/// An operation's deliveries: a `lifecycleEvents` subscription that `render` shares is set up
/// by async-graphql (validation, the resolver's checks) and then rendered by its shared
/// selection; anything else is executed by async-graphql, response by response.
async fn deliveries(
    (schema, state, principal): (LeaseholdSchema, AppState, Principal),
    request: Request,
) -> BoxStream<'static, Delivery> {
    let executed = |responses: BoxStream<'static, async_graphql::Response>| {
        responses.map(|response| Delivery::Response(Box::new(with_codes(response)))).boxed()
    };
    let renderer = &state.inner.renderer;
    let Some(plan) = renderer.plan(&principal, &request).await else {
        return executed(schema.execute_stream(request));
    };
    let handoff = Handoff::default();
    // Accepted, the resolver hands its feed over and leaves async-graphql an empty stream;
    // refused, the stream holds the errors.
    let mut setup = schema.execute_stream(request.data(handoff.clone()));
    let mut answered = Vec::new();
    while let Some(response) = setup.next().await {
        let live = response.errors.is_empty();
        answered.push(response);
        if live {
            // Executed after all (the resolver found no hand-over): deliver it as it runs,
            // rather than wait for a live stream's end.
            return executed(futures_util::stream::iter(answered).chain(setup).boxed());
        }
    }
    match handoff.take() {
        Some(feed) => rendered(feed, renderer.share(plan)),
        None => executed(futures_util::stream::iter(answered).boxed()),
    }
}

/// The feed's events, each as its selection's shared rendering; a failed read of the log is
/// reported once and ends the operation (the client resumes from its last cursor).
fn rendered(feed: Feed, selection: Arc<Selection>) -> BoxStream<'static, Delivery> {
    // The selection lives in the stream's state, one reference a subscriber: its count is
    // how many share it.
    futures_util::stream::unfold(Some((feed, selection)), |state| async move {
        let (mut feed, selection) = state?;
        match feed.next().await {
            Ok(Some(event)) => {
                let rendered = selection.render(&event).await;
                Some((Delivery::Rendered(rendered), Some((feed, selection))))
            }
            Ok(None) => None,
            Err(error) => {
                Some((Delivery::Response(Box::new(selection.failed(error.into()))), None))
            }
        }
    })
    .boxed()
}

/// The next text frame; `None` when the socket closed or failed.
async fn next_text(stream: &mut SplitStream<WebSocket>) -> Option<String> {
    loop {
        match stream.next().await? {
            Ok(Message::Text(text)) => return Some(text.to_string()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Returns once the server is stopping (or gone).
async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`; drop it here.
    let _ = stopping.wait_for(|stopping| *stopping).await.map(|_| ());
}

/// `Bearer <token>` from the init payload's `authorization` (any case).
fn token_of(payload: &Value) -> Option<&str> {
    payload
        .as_object()?
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case("authorization"))?
        .1
        .as_str()
}

fn error_list(code: Code, message: &str) -> Value {
    json!([{ "message": message, "extensions": { "code": code.as_str() } }])
}
