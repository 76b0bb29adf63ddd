//! The event envelope: what a writer hands to the log and what a reader gets back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Cursor, EventId, EventType, ExpectedVersion, StreamId, StreamType, TenantId};

/// Who caused an event: the authenticated subject and the role it acted in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The token's subject (`sub`).
    pub subject: String,
    /// The role the subject acted in (`tenant`, `operator`, `auditor`, `agent`).
    pub role: String,
}

/// Context stored beside every event. It never holds a secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// Who caused the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<Actor>,
    /// Ties together every event caused by one outside request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// The event or command that directly caused this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    /// The caller's idempotency key for the command that produced the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_key: Option<String>,
    /// The aggregate's generation (fencing token) once the command's events are applied: the
    /// one the command was checked against, or for a resume the one it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The distributed trace the command ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// An event a writer wants appended. The store adds the stream, version, time and hashes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Chosen by the writer; resending the same id is an idempotent retry.
    pub event_id: EventId,
    /// The event's name.
    pub event_type: EventType,
    /// The version of the payload's shape; a changed shape gets a new number and an upcaster.
    pub schema_version: u16,
    /// The event's body: any JSON value.
    pub payload: serde_json::Value,
    /// Who and what caused it.
    pub metadata: Metadata,
}

/// The events to append to one stream, and the version the stream must have first.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamAppend {
    /// The stream to append to.
    pub stream_id: StreamId,
    /// Its aggregate kind; must match the stream's if it already exists.
    pub stream_type: StreamType,
    /// Its owner; must match the stream's if it already exists.
    pub tenant_id: TenantId,
    /// The condition on the stream's current version.
    pub expected: ExpectedVersion,
    /// The events, in the order they get versions.
    pub events: Vec<NewEvent>,
}

/// An event as stored in the log.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    /// Where the event stands in the whole log.
    pub cursor: Cursor,
    /// The writer's id for it.
    pub event_id: EventId,
    /// The stream it belongs to.
    pub stream_id: StreamId,
    /// The stream's aggregate kind.
    pub stream_type: StreamType,
    /// The stream's owner.
    pub tenant_id: TenantId,
    /// Its version in the stream: 1 for the first event, then contiguous.
    pub version: u64,
    /// The event's name.
    pub event_type: EventType,
    /// The version of the payload's shape.
    pub schema_version: u16,
    /// The event's body.
    pub payload: serde_json::Value,
    /// Who and what caused it.
    pub metadata: Metadata,
    /// When the log committed it, stamped by the database, never by a client.
    pub recorded_at: DateTime<Utc>,
    /// The hash of the stream's previous event (all zeroes for the first).
    pub prev_hash: [u8; 32],
    /// `sha256(prev_hash || canonical JSON of this event)`.
    pub hash: [u8; 32],
}
