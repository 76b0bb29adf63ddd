//! The two GraphQL-over-WebSocket protocols, as messages: `graphql-transport-ws` (the
//! `graphql-ws` npm library's) and the legacy `graphql-ws` (subscriptions-transport-ws). Both
//! map onto one set of client and server messages; only the spelling differs.

use serde_json::{Value, json};

/// Which protocol a socket speaks (from `Sec-WebSocket-Protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `graphql-transport-ws`.
    TransportWs,
    /// The legacy `graphql-ws`.
    LegacyWs,
}

impl Protocol {
    /// Both, in the order the server prefers them.
    pub const NAMES: [&'static str; 2] = ["graphql-transport-ws", "graphql-ws"];

    /// The protocol a negotiated name stands for.
    pub fn of_name(name: &str) -> Option<Self> {
        match name {
            "graphql-transport-ws" => Some(Self::TransportWs),
            "graphql-ws" => Some(Self::LegacyWs),
            _ => None,
        }
    }
}

/// What a client may send.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `connection_init`, with its payload.
    Init(Value),
    /// `subscribe` / `start`: an operation under an id.
    Subscribe {
        /// The client's id for it.
        id: String,
        /// `{ query, variables, operationName, extensions }`.
        payload: Value,
    },
    /// `complete` / `stop`: the client is done with an id.
    Complete(String),
    /// `ping`.
    Ping(Option<Value>),
    /// `pong`.
    Pong,
    /// `connection_terminate` (legacy).
    Terminate,
}

/// Why a text frame is not a client message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidMessage(pub String);

impl ClientMessage {
    /// Parses a text frame in `protocol`.
    ///
    /// # Errors
    /// [`InvalidMessage`] when it is not JSON, has no known `type`, or lacks an `id`.
    pub fn parse(protocol: Protocol, text: &str) -> Result<Self, InvalidMessage> {
        let value: Value =
            serde_json::from_str(text).map_err(|_| InvalidMessage("not JSON".into()))?;
        let kind = value["type"].as_str().ok_or_else(|| InvalidMessage("no type".into()))?;
        let id = || {
            value["id"]
                .as_str()
                .filter(|id| !id.is_empty())
                .map(str::to_string)
                .ok_or_else(|| InvalidMessage(format!("{kind} without an id")))
        };
        let payload = value.get("payload").cloned().unwrap_or(Value::Null);
        match (protocol, kind) {
            (_, "connection_init") => Ok(Self::Init(payload)),
            (Protocol::TransportWs, "subscribe") | (Protocol::LegacyWs, "start") => {
                Ok(Self::Subscribe { id: id()?, payload })
            }
            (Protocol::TransportWs, "complete") | (Protocol::LegacyWs, "stop") => {
                Ok(Self::Complete(id()?))
            }
            (Protocol::TransportWs, "ping") => Ok(Self::Ping(value.get("payload").cloned())),
            (Protocol::TransportWs, "pong") => Ok(Self::Pong),
            (Protocol::LegacyWs, "connection_terminate") => Ok(Self::Terminate),
            (_, other) => Err(InvalidMessage(format!("unexpected message type {other:?}"))),
        }
    }
}

/// What the server sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    /// `connection_ack`.
    Ack,
    /// A result of an operation: `next` / `data`.
    Next {
        /// The operation's id.
        id: String,
        /// The GraphQL response.
        payload: Value,
    },
    /// The operation failed before it could run (validation): `error`.
    Error {
        /// The operation's id.
        id: String,
        /// The GraphQL errors.
        errors: Value,
    },
    /// The operation is over: `complete`.
    Complete(String),
    /// Keep-alive: `ping` / `ka`.
    KeepAlive,
    /// The answer to a client's `ping` (transport-ws only).
    Pong(Option<Value>),
}

impl ServerMessage {
    /// The text frame in `protocol`.
    pub fn to_text(&self, protocol: Protocol) -> String {
        let legacy = protocol == Protocol::LegacyWs;
        let message = match self {
            Self::Ack => json!({ "type": "connection_ack" }),
            Self::Next { id, payload } => {
                json!({ "type": if legacy { "data" } else { "next" }, "id": id, "payload": payload })
            }
            Self::Error { id, errors } => {
                // The legacy protocol's `error` carries one error object.
                let payload = if legacy { errors[0].clone() } else { errors.clone() };
                json!({ "type": "error", "id": id, "payload": payload })
            }
            Self::Complete(id) => json!({ "type": "complete", "id": id }),
            Self::KeepAlive => json!({ "type": if legacy { "ka" } else { "ping" } }),
            Self::Pong(Some(payload)) => json!({ "type": "pong", "payload": payload }),
            Self::Pong(None) => json!({ "type": "pong" }),
        };
        message.to_string()
    }
}

impl ServerMessage {
    /// The `next` (legacy: `data`) message for `id` whose payload is the JSON text `payload`,
    /// already rendered (shared among sockets): the same message [`Self::to_text`] writes for
    /// `Next`, without parsing the payload again.
    pub fn next_text(protocol: Protocol, id: &str, payload: &str) -> String {
        let kind = if protocol == Protocol::LegacyWs { "data" } else { "next" };
        let id = Value::from(id).to_string();
        format!(r#"{{"id":{id},"payload":{payload},"type":"{kind}"}}"#)
    }
}

/// Close codes, as the graphql-ws library reads them (it retries 1012, 1013, 4403, 4408; it
/// gives up on 4400, 4401, 4409, 4429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// 1000: the client asked to terminate.
    Normal,
    /// 1012: the server is restarting; reconnect.
    Restarting,
    /// 1013: the client did not read in time; reconnect and resume from the last cursor.
    TooSlow,
    /// 4400: a message that is not of the protocol.
    Invalid,
    /// 4401: subscribed before `connection_ack`.
    Unauthorized,
    /// 4403: no valid token, or it expired.
    Forbidden,
    /// 4408: no `connection_init` in time.
    InitTimeout,
    /// 4409: an id already in use.
    DuplicateId,
    /// 4429: a second `connection_init`.
    TooManyInits,
}

impl Close {
    /// The code.
    pub fn code(self) -> u16 {
        match self {
            Self::Normal => 1000,
            Self::Restarting => 1012,
            Self::TooSlow => 1013,
            Self::Invalid => 4400,
            Self::Unauthorized => 4401,
            Self::Forbidden => 4403,
            Self::InitTimeout => 4408,
            Self::DuplicateId => 4409,
            Self::TooManyInits => 4429,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_parse_to_the_same_messages() {
        let start = r#"{"type":"start","id":"1","payload":{"query":"{a}"}}"#;
        let subscribe = r#"{"type":"subscribe","id":"1","payload":{"query":"{a}"}}"#;
        let legacy = ClientMessage::parse(Protocol::LegacyWs, start).expect("valid");
        assert_eq!(ClientMessage::parse(Protocol::TransportWs, subscribe), Ok(legacy));
        assert!(ClientMessage::parse(Protocol::TransportWs, start).is_err());
        assert!(ClientMessage::parse(Protocol::TransportWs, r#"{"type":"subscribe"}"#).is_err());
        assert!(ClientMessage::parse(Protocol::TransportWs, "nope").is_err());
        let next = ServerMessage::Next { id: "1".into(), payload: json!({}) };
        assert!(next.to_text(Protocol::LegacyWs).contains(r#""type":"data""#));
        assert!(ServerMessage::KeepAlive.to_text(Protocol::LegacyWs).contains(r#""ka""#));
    }

    #[test]
    fn a_shared_rendering_makes_the_same_next_message_in_both_protocols() {
        let payload = json!({ "data": { "lifecycleEvents": { "cursor": "c\"1", "n": 2 } } });
        for protocol in [Protocol::TransportWs, Protocol::LegacyWs] {
            for id in ["1", "a \"quoted\" \\ id", "é"] {
                let next = ServerMessage::Next { id: id.into(), payload: payload.clone() };
                let expected: Value = serde_json::from_str(&next.to_text(protocol)).expect("JSON");
                let shared = ServerMessage::next_text(protocol, id, &payload.to_string());
                let shared: Value = serde_json::from_str(&shared).expect("JSON");
                assert_eq!(shared, expected);
            }
        }
    }
}
