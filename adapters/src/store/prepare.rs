//! Turning an append into the parameters of `leasehold_append`.
//!
//! [`prepare`] validates the append and renders payloads and metadata as canonical JSON, once.
//! [`encode`] then numbers and chains the events from the stream heads the writer believes in;
//! it runs again whenever the database reports that a head moved. Both are pure: every refusal
//! is decided before any SQL runs.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use leasehold_domain::limits::{APPEND_EVENTS_MAX, APPEND_STREAMS_MAX};
use leasehold_domain::{ExpectedVersion, StreamAppend, ValidationError};
use serde_json::Value;
use uuid::Uuid;

use crate::canonical::to_canonical_json;
use crate::chain::{CanonicalPieces, GENESIS_HASH, canonical_event_text, chain_hash};

/// A stream's last version and that version's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub version: u64,
    pub hash: [u8; 32],
}

impl Head {
    /// The head of a stream that does not exist yet.
    pub const EMPTY: Head = Head { version: 0, hash: GENESIS_HASH };
}

/// A validated append with its canonical JSON rendered. Streams are sorted by stream id (the
/// lock order); events keep the caller's order.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    pub appends: &'a [StreamAppend],
    /// For each sorted position, the caller's index.
    pub sorted: Vec<usize>,
    /// For each caller index, its sorted position.
    pub caller_order: Vec<usize>,
    /// Per caller append, per event: (canonical payload, canonical metadata).
    pub canonical: Vec<Vec<(String, String)>>,
}

impl Prepared<'_> {
    /// The append of the stream at sorted position `s`.
    pub fn stream(&self, s: usize) -> &StreamAppend {
        &self.appends[self.sorted[s]]
    }

    /// The head to chain from if nothing better is known: an empty stream for `NoStream`.
    pub fn known_head(&self, s: usize) -> Option<Head> {
        match self.stream(s).expected.required() {
            Some(0) => Some(Head::EMPTY),
            _ => None,
        }
    }
}

/// The parameters of one `leasehold_append` call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Encoded<'a> {
    pub stream_ids: Vec<&'a str>,
    pub stream_types: Vec<&'a str>,
    pub tenant_ids: Vec<&'a str>,
    pub expected: Vec<i64>,
    pub any: Vec<bool>,
    pub heads: Vec<Vec<u8>>,
    pub last_versions: Vec<i64>,
    pub last_hashes: Vec<Vec<u8>>,
    pub event_ids: Vec<Uuid>,
    pub event_streams: Vec<i32>,
    pub versions: Vec<i64>,
    pub event_types: Vec<&'a str>,
    pub schema_versions: Vec<i32>,
    pub payloads: Vec<&'a str>,
    pub metadata: Vec<&'a str>,
    pub prev_hashes: Vec<Vec<u8>>,
    pub hashes: Vec<Vec<u8>>,
    pub recorded_at: DateTime<Utc>,
    /// Each stream's head after the append, in sorted order.
    pub new_heads: Vec<Head>,
}

/// Validates `appends` and renders their canonical JSON.
pub(crate) fn prepare(
    appends: &[StreamAppend],
    payload_max_bytes: usize,
) -> Result<Prepared<'_>, ValidationError> {
    check_shape(appends)?;
    let mut sorted: Vec<usize> = (0..appends.len()).collect();
    sorted.sort_by(|&a, &b| appends[a].stream_id.cmp(&appends[b].stream_id));
    let mut caller_order = vec![0; appends.len()];
    for (position, &caller) in sorted.iter().enumerate() {
        caller_order[caller] = position;
    }
    let mut canonical = Vec::with_capacity(appends.len());
    for append in appends {
        let mut rendered = Vec::with_capacity(append.events.len());
        for event in &append.events {
            let payload = to_canonical_json(&event.payload);
            if payload.len() > payload_max_bytes {
                return Err(ValidationError::PayloadTooLarge {
                    event_id: event.event_id,
                    size_bytes: payload.len(),
                    max_bytes: payload_max_bytes,
                });
            }
            let metadata = serde_json::to_value(&event.metadata).unwrap_or(Value::Null);
            if contains_nul(&event.payload) || contains_nul(&metadata) {
                return Err(ValidationError::NulCharacter { event_id: event.event_id });
            }
            rendered.push((payload, to_canonical_json(&metadata)));
        }
        canonical.push(rendered);
    }
    Ok(Prepared { appends, sorted, caller_order, canonical })
}

/// Numbers and chains every event from `heads` (one per stream, in sorted order).
pub(crate) fn encode<'a>(
    p: &'a Prepared<'a>,
    heads: &[Head],
    recorded_at: DateTime<Utc>,
) -> Encoded<'a> {
    let streams = p.sorted.len();
    let events: usize = p.appends.iter().map(|a| a.events.len()).sum();
    let mut e = Encoded {
        stream_ids: Vec::with_capacity(streams),
        stream_types: Vec::with_capacity(streams),
        tenant_ids: Vec::with_capacity(streams),
        expected: Vec::with_capacity(streams),
        any: Vec::with_capacity(streams),
        heads: Vec::with_capacity(streams),
        last_versions: Vec::with_capacity(streams),
        last_hashes: Vec::with_capacity(streams),
        event_ids: Vec::with_capacity(events),
        event_streams: Vec::with_capacity(events),
        versions: Vec::with_capacity(events),
        event_types: Vec::with_capacity(events),
        schema_versions: Vec::with_capacity(events),
        payloads: Vec::with_capacity(events),
        metadata: Vec::with_capacity(events),
        prev_hashes: Vec::with_capacity(events),
        hashes: Vec::with_capacity(events),
        recorded_at,
        new_heads: heads.to_vec(),
    };
    for (s, head) in heads.iter().enumerate() {
        let append = p.stream(s);
        e.stream_ids.push(append.stream_id.as_str());
        e.stream_types.push(append.stream_type.as_str());
        e.tenant_ids.push(append.tenant_id.as_str());
        e.expected.push(to_i64(head.version));
        e.any.push(append.expected == ExpectedVersion::Any);
        e.heads.push(head.hash.to_vec());
    }
    for (caller, append) in p.appends.iter().enumerate() {
        let s = p.caller_order[caller];
        for (event, (payload, metadata)) in append.events.iter().zip(&p.canonical[caller]) {
            let head = &mut e.new_heads[s];
            let version = head.version + 1;
            let text = canonical_event_text(&CanonicalPieces {
                event_id: event.event_id.as_uuid(),
                event_type: event.event_type.as_str(),
                metadata_json: metadata,
                payload_json: payload,
                recorded_at,
                schema_version: u32::from(event.schema_version),
                stream_id: append.stream_id.as_str(),
                stream_type: append.stream_type.as_str(),
                tenant_id: append.tenant_id.as_str(),
                version,
            });
            let hash = chain_hash(&head.hash, &text);
            e.prev_hashes.push(head.hash.to_vec());
            e.hashes.push(hash.to_vec());
            *head = Head { version, hash };
            e.event_ids.push(event.event_id.as_uuid());
            e.event_streams.push(i32::try_from(s + 1).unwrap_or(i32::MAX));
            e.versions.push(to_i64(version));
            e.event_types.push(event.event_type.as_str());
            e.schema_versions.push(i32::from(event.schema_version));
            e.payloads.push(payload);
            e.metadata.push(metadata);
        }
    }
    for head in &e.new_heads {
        e.last_versions.push(to_i64(head.version));
        e.last_hashes.push(head.hash.to_vec());
    }
    e
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Counts, emptiness and duplicates.
fn check_shape(appends: &[StreamAppend]) -> Result<(), ValidationError> {
    if appends.is_empty() {
        return Err(ValidationError::EmptyAppend);
    }
    if appends.len() > APPEND_STREAMS_MAX {
        return Err(ValidationError::TooManyStreams {
            count: appends.len(),
            max: APPEND_STREAMS_MAX,
        });
    }
    let count: usize = appends.iter().map(|a| a.events.len()).sum();
    if count > APPEND_EVENTS_MAX {
        return Err(ValidationError::TooManyEvents { count, max: APPEND_EVENTS_MAX });
    }
    let mut streams = HashSet::with_capacity(appends.len());
    let mut event_ids = HashSet::with_capacity(count);
    for append in appends {
        if append.events.is_empty() {
            return Err(ValidationError::NoEventsForStream { stream: append.stream_id.clone() });
        }
        if !streams.insert(&append.stream_id) {
            return Err(ValidationError::DuplicateStream { stream: append.stream_id.clone() });
        }
        for event in &append.events {
            if !event_ids.insert(event.event_id) {
                return Err(ValidationError::DuplicateEventId { event_id: event.event_id });
            }
        }
    }
    Ok(())
}

/// PostgreSQL's `jsonb` cannot hold U+0000, in a string or in a key.
fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_domain::{
        EventId, EventType, Metadata, NewEvent, StreamId, StreamType, TenantId,
    };
    use serde_json::json;

    fn event(payload: Value) -> NewEvent {
        NewEvent {
            event_id: EventId::from_uuid(Uuid::now_v7()),
            event_type: EventType::parse("Happened").unwrap(),
            schema_version: 1,
            payload,
            metadata: Metadata::default(),
        }
    }

    fn append(stream: &str, expected: ExpectedVersion, events: Vec<NewEvent>) -> StreamAppend {
        StreamAppend {
            stream_id: StreamId::parse(stream).unwrap(),
            stream_type: StreamType::parse("lease").unwrap(),
            tenant_id: TenantId::parse("acme").unwrap(),
            expected,
            events,
        }
    }

    #[test]
    fn sorts_streams_keeps_event_order_and_chains_from_the_heads() {
        let appends = vec![
            append("b", ExpectedVersion::Exact(4), vec![event(json!(1)), event(json!(2))]),
            append("a", ExpectedVersion::NoStream, vec![event(json!(3))]),
        ];
        let prepared = prepare(&appends, 1024).unwrap();
        assert_eq!(prepared.known_head(0), Some(Head::EMPTY));
        assert_eq!(prepared.known_head(1), None);
        let b_head = Head { version: 4, hash: [7; 32] };
        let encoded = encode(&prepared, &[Head::EMPTY, b_head], Utc::now());
        assert_eq!(encoded.stream_ids, ["a", "b"]);
        assert_eq!(encoded.expected, [0, 4]);
        assert_eq!(encoded.event_streams, [2, 2, 1]);
        assert_eq!(encoded.versions, [5, 6, 1]);
        assert_eq!(encoded.payloads, ["1", "2", "3"]);
        assert_eq!(encoded.prev_hashes[0], vec![7; 32]);
        assert_eq!(encoded.prev_hashes[1], encoded.hashes[0]);
        assert_eq!(encoded.prev_hashes[2], GENESIS_HASH.to_vec());
        assert_eq!(encoded.last_versions, [1, 6]);
        assert_eq!(encoded.last_hashes[1], encoded.hashes[1]);
    }

    #[test]
    fn refuses_bad_shapes_before_any_sql() {
        assert!(matches!(prepare(&[], 10), Err(ValidationError::EmptyAppend)));
        let empty = [append("a", ExpectedVersion::Any, vec![])];
        assert!(matches!(prepare(&empty, 10), Err(ValidationError::NoEventsForStream { .. })));
        let twice = [
            append("a", ExpectedVersion::Any, vec![event(json!(1))]),
            append("a", ExpectedVersion::Any, vec![event(json!(1))]),
        ];
        assert!(matches!(prepare(&twice, 10), Err(ValidationError::DuplicateStream { .. })));
        let same = event(json!(1));
        let repeated = [append("a", ExpectedVersion::Any, vec![same.clone(), same])];
        assert!(matches!(prepare(&repeated, 10), Err(ValidationError::DuplicateEventId { .. })));
    }

    #[test]
    fn refuses_large_payloads_and_nul_characters() {
        let big = [append("a", ExpectedVersion::Any, vec![event(json!("x".repeat(100)))])];
        assert!(matches!(
            prepare(&big, 100),
            Err(ValidationError::PayloadTooLarge { size_bytes: 102, max_bytes: 100, .. })
        ));
        let nul = [append("a", ExpectedVersion::Any, vec![event(json!({"k": "a\u{0}b"}))])];
        assert!(matches!(prepare(&nul, 100), Err(ValidationError::NulCharacter { .. })));
        let nul_key = [append("a", ExpectedVersion::Any, vec![event(json!({"\u{0}": 1}))])];
        assert!(matches!(prepare(&nul_key, 100), Err(ValidationError::NulCharacter { .. })));
    }
}
