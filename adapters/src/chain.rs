//! The per-stream hash chain: `hash = sha256(prev_hash || RFC 8785 JSON of the event)`.
//!
//! `leasehold_append` (schema/postgres/0002_append.sql) computes the chain inside the append
//! transaction; this module recomputes it from what a reader gets back, which is what makes the
//! log tamper-evident: a verifier needs only the stored rows and this definition.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::canonical::to_canonical_json;

/// The `prev_hash` of a stream's first event.
pub const GENESIS_HASH: [u8; 32] = [0; 32];

/// The stored fields of an event that its hash covers, as read back from the log.
/// Payload and metadata are the raw JSON, so a field a typed reader would ignore still counts.
#[derive(Debug, Clone, Copy)]
pub struct HashedFields<'a> {
    /// The event id.
    pub event_id: Uuid,
    /// The event type.
    pub event_type: &'a str,
    /// The raw metadata object.
    pub metadata: &'a Value,
    /// The raw payload.
    pub payload: &'a Value,
    /// The commit time, which the database stores to the microsecond.
    pub recorded_at: DateTime<Utc>,
    /// The payload's schema version.
    pub schema_version: u32,
    /// The stream id.
    pub stream_id: &'a str,
    /// The stream type.
    pub stream_type: &'a str,
    /// The owning tenant.
    pub tenant_id: &'a str,
    /// The version in the stream.
    pub version: u64,
}

/// The canonical JSON document an event's hash covers.
pub fn canonical_event(fields: &HashedFields<'_>) -> String {
    let mut object = Map::new();
    object.insert("event_id".into(), Value::String(fields.event_id.to_string()));
    object.insert("event_type".into(), Value::String(fields.event_type.into()));
    object.insert("metadata".into(), fields.metadata.clone());
    object.insert("payload".into(), fields.payload.clone());
    let recorded_at = fields.recorded_at.to_rfc3339_opts(SecondsFormat::Micros, true);
    object.insert("recorded_at".into(), Value::String(recorded_at));
    object.insert("schema_version".into(), Value::from(fields.schema_version));
    object.insert("stream_id".into(), Value::String(fields.stream_id.into()));
    object.insert("stream_type".into(), Value::String(fields.stream_type.into()));
    object.insert("tenant_id".into(), Value::String(fields.tenant_id.into()));
    object.insert("version".into(), Value::from(fields.version));
    to_canonical_json(&Value::Object(object))
}

/// `sha256(prev_hash || canonical_event(fields))`.
pub fn event_hash(prev_hash: &[u8; 32], fields: &HashedFields<'_>) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash);
    hasher.update(canonical_event(fields).as_bytes());
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields<'a>(payload: &'a Value, metadata: &'a Value) -> HashedFields<'a> {
        HashedFields {
            event_id: Uuid::nil(),
            event_type: "LeaseProvisioned",
            metadata,
            payload,
            recorded_at: DateTime::from_timestamp(1_800_000_000, 123_456_000).unwrap(),
            schema_version: 1,
            stream_id: "lease-1",
            stream_type: "lease",
            tenant_id: "acme",
            version: 2,
        }
    }

    #[test]
    fn canonical_event_has_sorted_keys_and_microsecond_time() {
        let payload = json!({"b": 1, "a": [true]});
        let metadata = json!({});
        let text = canonical_event(&fields(&payload, &metadata));
        assert_eq!(
            text,
            concat!(
                r#"{"event_id":"00000000-0000-0000-0000-000000000000","event_type":"LeaseProvisioned","#,
                r#""metadata":{},"payload":{"a":[true],"b":1},"recorded_at":"2027-01-15T08:00:00.123456Z","#,
                r#""schema_version":1,"stream_id":"lease-1","stream_type":"lease","tenant_id":"acme","version":2}"#
            )
        );
    }

    #[test]
    fn any_change_changes_the_hash() {
        let payload = json!({"a": 1});
        let other = json!({"a": 2});
        let metadata = json!({});
        let base = event_hash(&GENESIS_HASH, &fields(&payload, &metadata));
        assert_ne!(base, event_hash(&GENESIS_HASH, &fields(&other, &metadata)));
        assert_ne!(base, event_hash(&[1; 32], &fields(&payload, &metadata)));
    }
}
