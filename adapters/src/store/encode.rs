//! Turning an append into the arrays `leasehold_append` takes, validating it on the way.
//! Pure: no I/O, so every refusal is decided before any SQL runs.

use std::collections::HashSet;

use leasehold_domain::limits::{APPEND_EVENTS_MAX, APPEND_STREAMS_MAX};
use leasehold_domain::{StreamAppend, ValidationError};
use serde_json::Value;
use uuid::Uuid;

use crate::canonical::to_canonical_json;

/// The parameters of one `leasehold_append` call. Streams are sorted by stream id (the lock
/// order); events keep the caller's order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EncodedAppend {
    pub stream_ids: Vec<String>,
    pub stream_types: Vec<String>,
    pub tenant_ids: Vec<String>,
    /// `None` for `Any`.
    pub expected: Vec<Option<i64>>,
    pub event_ids: Vec<Uuid>,
    /// 1-based index into the stream arrays.
    pub event_streams: Vec<i32>,
    pub event_types: Vec<String>,
    pub schema_versions: Vec<i32>,
    pub payloads: Vec<String>,
    pub metadata: Vec<String>,
    /// For each stream in the caller's order, its index in the sorted arrays.
    pub caller_order: Vec<usize>,
}

/// Validates `appends` and encodes them.
pub(crate) fn encode(
    appends: &[StreamAppend],
    payload_max_bytes: usize,
) -> Result<EncodedAppend, ValidationError> {
    check_shape(appends)?;
    let mut sorted: Vec<usize> = (0..appends.len()).collect();
    sorted.sort_by(|&a, &b| appends[a].stream_id.cmp(&appends[b].stream_id));
    let mut caller_order = vec![0; appends.len()];
    for (sorted_index, &caller_index) in sorted.iter().enumerate() {
        caller_order[caller_index] = sorted_index;
    }
    let mut encoded = EncodedAppend {
        stream_ids: Vec::with_capacity(appends.len()),
        stream_types: Vec::with_capacity(appends.len()),
        tenant_ids: Vec::with_capacity(appends.len()),
        expected: Vec::with_capacity(appends.len()),
        event_ids: Vec::new(),
        event_streams: Vec::new(),
        event_types: Vec::new(),
        schema_versions: Vec::new(),
        payloads: Vec::new(),
        metadata: Vec::new(),
        caller_order,
    };
    for &index in &sorted {
        let append = &appends[index];
        encoded.stream_ids.push(append.stream_id.to_string());
        encoded.stream_types.push(append.stream_type.to_string());
        encoded.tenant_ids.push(append.tenant_id.to_string());
        let required = append.expected.required();
        encoded.expected.push(required.map(|v| i64::try_from(v).unwrap_or(i64::MAX)));
    }
    for (caller_index, append) in appends.iter().enumerate() {
        let stream_number = encoded.caller_order[caller_index] + 1;
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
            encoded.event_ids.push(event.event_id.as_uuid());
            encoded.event_streams.push(i32::try_from(stream_number).unwrap_or(i32::MAX));
            encoded.event_types.push(event.event_type.to_string());
            encoded.schema_versions.push(i32::from(event.schema_version));
            encoded.payloads.push(payload);
            encoded.metadata.push(to_canonical_json(&metadata));
        }
    }
    Ok(encoded)
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
        EventId, EventType, ExpectedVersion, Metadata, NewEvent, StreamId, StreamType, TenantId,
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

    fn append(stream: &str, events: Vec<NewEvent>) -> StreamAppend {
        StreamAppend {
            stream_id: StreamId::parse(stream).unwrap(),
            stream_type: StreamType::parse("lease").unwrap(),
            tenant_id: TenantId::parse("acme").unwrap(),
            expected: ExpectedVersion::Any,
            events,
        }
    }

    #[test]
    fn sorts_streams_and_keeps_event_order() {
        let appends = vec![
            append("b", vec![event(json!(1)), event(json!(2))]),
            append("a", vec![event(json!(3))]),
        ];
        let encoded = encode(&appends, 1024).unwrap();
        assert_eq!(encoded.stream_ids, ["a", "b"]);
        assert_eq!(encoded.event_streams, [2, 2, 1]);
        assert_eq!(encoded.payloads, ["1", "2", "3"]);
        assert_eq!(encoded.caller_order, [1, 0]);
        assert_eq!(encoded.expected, [None, None]);
    }

    #[test]
    fn refuses_bad_shapes_before_any_sql() {
        assert_eq!(encode(&[], 10), Err(ValidationError::EmptyAppend));
        let empty = append("a", vec![]);
        assert!(matches!(encode(&[empty], 10), Err(ValidationError::NoEventsForStream { .. })));
        let twice = vec![append("a", vec![event(json!(1))]), append("a", vec![event(json!(1))])];
        assert!(matches!(encode(&twice, 10), Err(ValidationError::DuplicateStream { .. })));
        let same = event(json!(1));
        let repeated = append("a", vec![same.clone(), same]);
        assert!(matches!(encode(&[repeated], 10), Err(ValidationError::DuplicateEventId { .. })));
    }

    #[test]
    fn refuses_large_payloads_and_nul_characters() {
        let big = append("a", vec![event(json!("x".repeat(100)))]);
        assert!(matches!(
            encode(&[big], 100),
            Err(ValidationError::PayloadTooLarge { size_bytes: 102, max_bytes: 100, .. })
        ));
        let nul = append("a", vec![event(json!({"k": "a\u{0}b"}))]);
        assert!(matches!(encode(&[nul], 100), Err(ValidationError::NulCharacter { .. })));
        let nul_key = append("a", vec![event(json!({"\u{0}": 1}))]);
        assert!(matches!(encode(&[nul_key], 100), Err(ValidationError::NulCharacter { .. })));
    }
}
