//! A raw GraphQL-over-WebSocket client (both protocols), to see every frame and close code.

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::support::Server;

/// Longest a test waits for one frame.
const FRAME_WAIT: Duration = Duration::from_secs(30);

type Stream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What arrived.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A protocol message.
    Message(Value),
    /// The server closed with this code.
    Closed(u16),
}

/// One socket.
#[derive(Debug)]
pub struct Socket {
    stream: Stream,
    /// `graphql-transport-ws` or `graphql-ws`.
    pub protocol: &'static str,
}

impl Socket {
    /// Opens `/graphql/ws` offering `protocol`.
    pub async fn open(server: &Server, protocol: &'static str) -> Socket {
        let url = format!("{}/graphql/ws", server.base.replace("http://", "ws://"));
        let mut request = url.into_client_request().expect("a valid URL");
        request.headers_mut().insert("sec-websocket-protocol", protocol.parse().expect("a header"));
        let (stream, _) = tokio_tungstenite::connect_async(request).await.expect("upgrades");
        Socket { stream, protocol }
    }

    /// Opens `/graphql/ws` over a socket with a small receive buffer, for a client that stops
    /// reading: the server's sends then block after a few frames instead of a few megabytes.
    pub async fn open_small(server: &Server, protocol: &'static str) -> Socket {
        let address = server.base.trim_start_matches("http://");
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a small buffer");
        let tcp = socket.connect(address.parse().expect("an address")).await.expect("connects");
        let url = format!("ws://{address}/graphql/ws");
        let mut request = url.into_client_request().expect("a valid URL");
        request.headers_mut().insert("sec-websocket-protocol", protocol.parse().expect("a header"));
        let (stream, _) =
            tokio_tungstenite::client_async(request, tokio_tungstenite::MaybeTlsStream::Plain(tcp))
                .await
                .expect("upgrades");
        Socket { stream, protocol }
    }

    /// Opens and initialises with `token`, expecting the ack.
    pub async fn connect(server: &Server, protocol: &'static str, token: &str) -> Socket {
        let mut socket = Socket::open(server, protocol).await;
        socket.init(token).await;
        assert_eq!(socket.message().await["type"], "connection_ack");
        socket
    }

    /// Sends `connection_init` with `token`.
    pub async fn init(&mut self, token: &str) {
        let payload = json!({ "authorization": format!("Bearer {token}") });
        self.send(json!({ "type": "connection_init", "payload": payload })).await;
    }

    /// Sends one message.
    pub async fn send(&mut self, message: Value) {
        self.stream.send(Message::Text(message.to_string().into())).await.expect("sent");
    }

    /// Starts operation `id`.
    pub async fn subscribe(&mut self, id: &str, query: &str, variables: Value) {
        let kind = if self.protocol == "graphql-ws" { "start" } else { "subscribe" };
        let payload = json!({ "query": query, "variables": variables });
        self.send(json!({ "type": kind, "id": id, "payload": payload })).await;
    }

    /// The next frame, keep-alives included.
    pub async fn frame(&mut self) -> Frame {
        loop {
            let next = tokio::time::timeout(FRAME_WAIT, self.stream.next()).await;
            match next.expect("a frame in time") {
                Some(Ok(Message::Text(text))) => {
                    return Frame::Message(serde_json::from_str(&text).expect("JSON"));
                }
                Some(Ok(Message::Close(frame))) => {
                    return Frame::Closed(frame.map_or(1005, |frame| u16::from(frame.code)));
                }
                Some(Ok(_)) => {}
                // Reset or dropped without a closing frame: 1006, as browsers report it.
                Some(Err(_)) | None => return Frame::Closed(1006),
            }
        }
    }

    /// The next message that is not a keep-alive.
    pub async fn message(&mut self) -> Value {
        loop {
            match self.frame().await {
                Frame::Message(message)
                    if matches!(message["type"].as_str(), Some("ping" | "ka")) => {}
                Frame::Message(message) => return message,
                Frame::Closed(code) => panic!("closed with {code} while a message was expected"),
            }
        }
    }

    /// The close code, skipping messages before it (within the frame wait, pings or not).
    pub async fn close_code(&mut self) -> u16 {
        let closed = tokio::time::timeout(FRAME_WAIT, async {
            loop {
                if let Frame::Closed(code) = self.frame().await {
                    return code;
                }
            }
        });
        closed.await.expect("closed in time")
    }

    /// The next event of operation `id`.
    pub async fn event(&mut self, id: &str) -> Value {
        let message = self.message().await;
        assert_eq!(message["id"], id, "{message}");
        assert!(matches!(message["type"].as_str(), Some("next" | "data")), "{message}");
        assert!(message["payload"].get("errors").is_none(), "{message}");
        message["payload"]["data"]["lifecycleEvents"].clone()
    }
}

/// The subscription the tests use.
pub const LIFECYCLE: &str = "subscription($after: String, $filter: EventFilter) {
    lifecycleEvents(after: $after, filter: $filter) {
        cursor streamId streamType version type recordedAt payload tenantId
    }
}";
