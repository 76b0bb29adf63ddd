//! The per-stream hash chain: `hash = sha256(prev_hash || RFC 8785 JSON of the event)`.
//!
//! The writer (the store's append) chains each event from its stream's head before it calls
//! `leasehold_append`, which checks the head under the stream's row lock; a verifier
//! recomputes the chain from what a reader gets back, which is what makes the log
//! tamper-evident: it needs only the stored rows and this definition.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::canonical::write_string;

/// The `prev_hash` of a stream's first event.
pub const GENESIS_HASH: [u8; 32] = [0; 32];

/// The stored fields of an event that its hash covers, with payload and metadata in canonical
/// JSON. A writer renders them before it hashes; a verifier renders what it reads back (as raw
/// JSON, so that a field a typed reader would ignore still counts).
#[derive(Debug, Clone, Copy)]
pub struct CanonicalPieces<'a> {
    /// The event id.
    pub event_id: Uuid,
    /// The event type.
    pub event_type: &'a str,
    /// The metadata object as RFC 8785 JSON.
    pub metadata_json: &'a str,
    /// The payload as RFC 8785 JSON.
    pub payload_json: &'a str,
    /// The commit time, to the microsecond.
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

/// The canonical JSON document an event's hash covers, assembled from canonical pieces.
/// Keys appear in RFC 8785 order (all ASCII, so byte order); a property test checks that the
/// result is exactly RFC 8785 of the whole object. Integers are printed exactly, which is what
/// RFC 8785 prints for every integer below 2^53; versions and schema versions stay far below.
pub fn canonical_event_text(p: &CanonicalPieces<'_>) -> String {
    let mut out = String::new();
    write_event_text(&mut out, p, &recorded_at_text(p.recorded_at));
    out
}

/// The commit time as the hash covers it: RFC 3339 in UTC, to the microsecond.
pub fn recorded_at_text(recorded_at: DateTime<Utc>) -> String {
    recorded_at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// [`canonical_event_text`] written into `out` (cleared first), with the commit time given
/// as [`recorded_at_text`] renders it: a writer chaining many events of one commit formats
/// the time once and reuses one buffer.
pub fn write_event_text(out: &mut String, p: &CanonicalPieces<'_>, recorded_at: &str) {
    out.clear();
    out.reserve(p.payload_json.len() + p.metadata_json.len() + 256);
    out.push_str("{\"event_id\":\"");
    out.push_str(p.event_id.hyphenated().encode_lower(&mut Uuid::encode_buffer()));
    out.push_str("\",\"event_type\":");
    write_string(out, p.event_type);
    out.push_str(",\"metadata\":");
    out.push_str(p.metadata_json);
    out.push_str(",\"payload\":");
    out.push_str(p.payload_json);
    out.push_str(",\"recorded_at\":\"");
    out.push_str(recorded_at);
    let _ = write!(out, "\",\"schema_version\":{}", p.schema_version);
    out.push_str(",\"stream_id\":");
    write_string(out, p.stream_id);
    out.push_str(",\"stream_type\":");
    write_string(out, p.stream_type);
    out.push_str(",\"tenant_id\":");
    write_string(out, p.tenant_id);
    let _ = write!(out, ",\"version\":{}}}", p.version);
}

/// `sha256(prev_hash || canonical_text)`.
pub fn chain_hash(prev_hash: &[u8; 32], canonical_text: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash);
    hasher.update(canonical_text.as_bytes());
    hasher.finalize().into()
}

/// A seal's digest: `sha256(prev_digest || hashes)`, `hashes` being the covered events'
/// hashes concatenated in log order (the first seal's `prev_digest` is [`GENESIS_HASH`]).
pub fn seal_digest(prev_digest: &[u8; 32], hashes: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(prev_digest);
    hasher.update(hashes);
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::to_canonical_json;
    use serde_json::{Value, json};

    /// Renders `payload` and `metadata` and runs `check` on the pieces of a sample event.
    fn with_pieces<T>(
        payload: &Value,
        metadata: &Value,
        check: impl FnOnce(CanonicalPieces<'_>) -> T,
    ) -> T {
        let (payload_json, metadata_json) =
            (to_canonical_json(payload), to_canonical_json(metadata));
        check(CanonicalPieces {
            event_id: Uuid::nil(),
            event_type: "LeaseProvisioned",
            metadata_json: &metadata_json,
            payload_json: &payload_json,
            recorded_at: DateTime::from_timestamp(1_800_000_000, 123_456_000).unwrap(),
            schema_version: 1,
            stream_id: "lease-1",
            stream_type: "lease",
            tenant_id: "acme",
            version: 2,
        })
    }

    #[test]
    fn canonical_event_has_sorted_keys_and_microsecond_time() {
        let text =
            with_pieces(&json!({"b": 1, "a": [true]}), &json!({}), |p| canonical_event_text(&p));
        assert_eq!(
            text,
            concat!(
                r#"{"event_id":"00000000-0000-0000-0000-000000000000","event_type":"LeaseProvisioned","#,
                r#""metadata":{},"payload":{"a":[true],"b":1},"recorded_at":"2027-01-15T08:00:00.123456Z","#,
                r#""schema_version":1,"stream_id":"lease-1","stream_type":"lease","tenant_id":"acme","version":2}"#
            )
        );
    }

    proptest::proptest! {
        #[test]
        fn assembled_text_is_rfc8785_of_the_whole_event(
            key in "[a-z\\u{e9}\\u{1f600}]{0,6}",
            text in "\\PC{0,12}",
            number in proptest::num::f64::NORMAL,
            version in 1u64..(1 << 53),
            micros in 0i64..4_000_000_000_000_000,
        ) {
            let payload = json!({key.clone(): [text.clone(), number], "z": {"y": null}});
            let metadata = json!({"operation_key": text, "generation": 3});
            let recorded_at = DateTime::from_timestamp_micros(micros).unwrap();
            let (assembled, whole) = with_pieces(&payload, &metadata, |mut p| {
                p.version = version;
                p.recorded_at = recorded_at;
                let whole = to_canonical_json(&json!({
                    "event_id": p.event_id.to_string(),
                    "event_type": p.event_type,
                    "metadata": metadata,
                    "payload": payload,
                    "recorded_at": recorded_at.to_rfc3339_opts(SecondsFormat::Micros, true),
                    "schema_version": p.schema_version,
                    "stream_id": p.stream_id,
                    "stream_type": p.stream_type,
                    "tenant_id": p.tenant_id,
                    "version": version,
                }));
                (canonical_event_text(&p), whole)
            });
            proptest::prop_assert_eq!(assembled, whole);
        }
    }

    #[test]
    fn any_change_changes_the_hash() {
        let hash_of = |payload: Value, prev: [u8; 32]| {
            with_pieces(&payload, &json!({}), |p| chain_hash(&prev, &canonical_event_text(&p)))
        };
        let base = hash_of(json!({"a": 1}), GENESIS_HASH);
        assert_ne!(base, hash_of(json!({"a": 2}), GENESIS_HASH));
        assert_ne!(base, hash_of(json!({"a": 1}), [1; 32]));
        assert_eq!(base, hash_of(json!({"a": 1}), GENESIS_HASH));
    }
}
