//! GraphQL over WebSocket on `/graphql/ws`, in both protocols, with our own connection
//! handling (see `connection`).

mod connection;
mod protocol;
pub(crate) mod render;

use axum::extract::State;
use axum::extract::ws::WebSocketUpgrade;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub use protocol::Protocol;

use crate::http::Http;

/// Upgrades a request that offers one of the two protocols; refuses others with 400.
pub(crate) async fn upgrade(State(http): State<Http>, upgrade: WebSocketUpgrade) -> Response {
    let upgrade = upgrade.protocols(Protocol::NAMES);
    let protocol =
        upgrade.selected_protocol().and_then(|name| name.to_str().ok()).and_then(Protocol::of_name);
    let Some(protocol) = protocol else {
        let message = "offer Sec-WebSocket-Protocol graphql-transport-ws or graphql-ws\n";
        return (StatusCode::BAD_REQUEST, message).into_response();
    };
    let Http { state, schema } = http;
    upgrade.on_upgrade(move |socket| async move {
        let _open = state.inner.sockets.open();
        connection::serve(socket, protocol, state, schema).await;
    })
}
