//! Turning an append into the parameters of `leasehold_append`.
//!
//! [`prepare`] validates the append and renders payloads and metadata as canonical JSON, once.
//! [`encode`] then numbers and chains the events from the stream heads the writer believes in;
//! it runs again whenever the database reports that a head moved. Both are pure: every refusal
//! is decided before any SQL runs.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use leasehold_domain::limits::{APPEND_EVENTS_MAX, APPEND_STREAMS_MAX};
use leasehold_domain::{ExpectedVersion, LedgerEntry, Metadata, StreamAppend, ValidationError};
use serde_json::Value;
use uuid::Uuid;

use super::to_i64;
use crate::canonical::to_canonical_json;
use crate::chain::{CanonicalPieces, GENESIS_HASH, chain_hash, recorded_at_text, write_event_text};

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
    pub canonical: Rendered,
    /// The idempotency ledger row to write with the events, if the append carries one.
    pub ledger: Option<&'a LedgerEntry>,
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

/// The parameters of one `leasehold_append` call: a group of appends, each with its entries
/// (one per stream) and events.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Encoded<'a> {
    pub streams: Vec<&'a str>,
    pub entry_append: Vec<i32>,
    pub entry_stream: Vec<i32>,
    pub entry_type: Vec<&'a str>,
    pub entry_tenant: Vec<&'a str>,
    pub entry_expected: Vec<i64>,
    pub entry_any: Vec<bool>,
    pub entry_head: Vec<[u8; 32]>,
    /// The entry's first event (1-based, in the event arrays) and its number of events: the
    /// function derives each event's version and prev_hash, and the stream's new head, from
    /// them and the head (schema/postgres/0007_append_derived.sql).
    pub entry_first: Vec<i32>,
    pub entry_events: Vec<i32>,
    pub event_entry: Vec<i32>,
    pub event_ids: Vec<Uuid>,
    pub event_types: Vec<&'a str>,
    pub event_schema_versions: Vec<i32>,
    pub event_payloads: Vec<&'a str>,
    pub event_metadata: Vec<&'a str>,
    pub event_hashes: Vec<[u8; 32]>,
    pub append_events: Vec<i32>,
    pub recorded_at: DateTime<Utc>,
    pub ledger: LedgerRows<'a>,
    /// Per append, each stream's head after it (in its sorted order).
    pub new_heads: Vec<Vec<Head>>,
}

/// The ledger rows of a group, ordered by (tenant, namespace, operation key): the order in
/// which concurrent transactions take the keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LedgerRows<'a> {
    pub append: Vec<i32>,
    pub tenant: Vec<&'a str>,
    pub namespace: Vec<&'a str>,
    pub key: Vec<&'a str>,
    pub hash: Vec<&'a [u8]>,
    pub stream: Vec<&'a str>,
    pub first: Vec<i64>,
    pub last: Vec<i64>,
    /// The append's last event (stream and version), whose cursor the command answers.
    pub cursor_stream: Vec<&'a str>,
    pub cursor_version: Vec<i64>,
}

/// One append of a group and the heads (one per stream, in sorted order) it chains from.
pub(crate) type Member<'a> = (&'a Prepared<'a>, Vec<Head>);

/// Numbers and chains every event of every append of `group`.
pub(crate) fn encode<'a>(group: &[Member<'a>], recorded_at: DateTime<Utc>) -> Encoded<'a> {
    let mut streams: Vec<&'a str> =
        group.iter().flat_map(|(p, _)| p.appends.iter().map(|a| a.stream_id.as_str())).collect();
    streams.sort_unstable();
    streams.dedup();
    let mut e = Encoded {
        streams,
        entry_append: Vec::new(),
        entry_stream: Vec::new(),
        entry_type: Vec::new(),
        entry_tenant: Vec::new(),
        entry_expected: Vec::new(),
        entry_any: Vec::new(),
        entry_head: Vec::new(),
        entry_first: Vec::new(),
        entry_events: Vec::new(),
        event_entry: Vec::new(),
        event_ids: Vec::new(),
        event_types: Vec::new(),
        event_schema_versions: Vec::new(),
        event_payloads: Vec::new(),
        event_metadata: Vec::new(),
        event_hashes: Vec::new(),
        append_events: Vec::with_capacity(group.len()),
        recorded_at,
        ledger: LedgerRows::default(),
        new_heads: Vec::with_capacity(group.len()),
    };
    // One commit time for the whole group, formatted once; one text buffer for every hash.
    let mut chaining = Chaining { recorded_at: recorded_at_text(recorded_at), text: String::new() };
    for (number, (prepared, heads)) in group.iter().enumerate() {
        let first_entry = e.entry_append.len();
        let events: usize = prepared.appends.iter().map(|a| a.events.len()).sum();
        e.append_events.push(to_i32(events));
        push_entries(&mut e, prepared, heads, number + 1);
        let mut new_heads = heads.clone();
        push_events(&mut e, prepared, &mut new_heads, first_entry, &mut chaining);
        e.new_heads.push(new_heads);
    }
    e.ledger = ledger_rows(group, &e.new_heads);
    e
}

/// One ledger entry as encoded: the append's number, the entry, its stream's version range,
/// and the append's last event.
struct LedgerRow<'a> {
    number: usize,
    entry: &'a LedgerEntry,
    first: u64,
    last: u64,
    cursor: (&'a str, u64),
}

/// Each ledger entry with its stream's version range in this append and the append's last
/// event (the last of its last stream in the caller's order: positions ascend in that order).
fn ledger_rows<'a>(group: &[Member<'a>], new_heads: &[Vec<Head>]) -> LedgerRows<'a> {
    let mut entries: Vec<LedgerRow<'a>> = Vec::new();
    for (number, (prepared, heads)) in group.iter().enumerate() {
        let Some(entry) = prepared.ledger else { continue };
        let s = (0..heads.len()).find(|&s| prepared.stream(s).stream_id == entry.stream);
        // The store refuses a ledger entry naming a stream outside its append before encoding.
        let s = s.expect("the ledger's stream is one of the append's");
        // Every stream's part has events (validated), so the last event is the last part's.
        let last_caller = prepared.appends.len() - 1;
        let cursor_stream = prepared.appends[last_caller].stream_id.as_str();
        let cursor_version = new_heads[number][prepared.caller_order[last_caller]].version;
        entries.push(LedgerRow {
            number: number + 1,
            entry,
            first: heads[s].version + 1,
            last: new_heads[number][s].version,
            cursor: (cursor_stream, cursor_version),
        });
    }
    entries.sort_by(|a, b| ledger_key(a.entry).cmp(&ledger_key(b.entry)));
    let mut rows = LedgerRows::default();
    for row in entries {
        rows.append.push(to_i32(row.number));
        rows.tenant.push(row.entry.tenant.as_str());
        rows.namespace.push(row.entry.namespace.as_str());
        rows.key.push(row.entry.operation_key.as_str());
        rows.hash.push(&row.entry.request_hash.0);
        rows.stream.push(row.entry.stream.as_str());
        rows.first.push(to_i64(row.first));
        rows.last.push(to_i64(row.last));
        rows.cursor_stream.push(row.cursor.0);
        rows.cursor_version.push(to_i64(row.cursor.1));
    }
    rows
}

/// The order in which a transaction takes its ledger keys.
fn ledger_key(entry: &LedgerEntry) -> (&str, &str, &str) {
    (entry.tenant.as_str(), entry.namespace.as_str(), entry.operation_key.as_str())
}

/// One entry per stream of the append, in its sorted order.
fn push_entries<'a>(e: &mut Encoded<'a>, p: &'a Prepared<'a>, heads: &[Head], number: usize) {
    for (s, head) in heads.iter().enumerate() {
        let append = p.stream(s);
        let stream = e.streams.binary_search(&append.stream_id.as_str()).unwrap_or_default();
        e.entry_append.push(to_i32(number));
        e.entry_stream.push(to_i32(stream + 1));
        e.entry_type.push(append.stream_type.as_str());
        e.entry_tenant.push(append.tenant_id.as_str());
        e.entry_expected.push(to_i64(head.version));
        e.entry_any.push(append.expected == ExpectedVersion::Any);
        e.entry_head.push(head.hash);
    }
    e.entry_first.resize(e.entry_append.len(), 0);
    e.entry_events.resize(e.entry_append.len(), 0);
}

/// What every event of a group is hashed with: the commit time as the hash covers it, and a
/// buffer for each event's canonical text.
struct Chaining {
    recorded_at: String,
    text: String,
}

/// The append's events in the caller's order, numbered and chained from `heads`, which end
/// as the streams' new heads.
fn push_events<'a>(
    e: &mut Encoded<'a>,
    p: &'a Prepared<'a>,
    heads: &mut [Head],
    first: usize,
    chaining: &mut Chaining,
) {
    let recorded_at = e.recorded_at;
    for (caller, append) in p.appends.iter().enumerate() {
        let s = p.caller_order[caller];
        let entry = first + s;
        e.entry_first[entry] = to_i32(e.event_ids.len() + 1);
        e.entry_events[entry] = to_i32(append.events.len());
        for (event, (payload, metadata)) in append.events.iter().zip(&p.canonical[caller]) {
            let head = &mut heads[s];
            let version = head.version + 1;
            let pieces = CanonicalPieces {
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
            };
            write_event_text(&mut chaining.text, &pieces, &chaining.recorded_at);
            let hash = chain_hash(&head.hash, &chaining.text);
            e.event_hashes.push(hash);
            *head = Head { version, hash };
            e.event_entry.push(to_i32(entry + 1));
            e.event_ids.push(event.event_id.as_uuid());
            e.event_types.push(event.event_type.as_str());
            e.event_schema_versions.push(i32::from(event.schema_version));
            e.event_payloads.push(payload);
            e.event_metadata.push(metadata);
        }
    }
}

fn to_i32(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// Per append, per event: (canonical payload, canonical metadata).
pub(crate) type Rendered = Vec<Vec<(String, String)>>;

/// Validates `appends` and renders their canonical JSON.
pub(crate) fn prepare(
    appends: &[StreamAppend],
    payload_max_bytes: usize,
) -> Result<Prepared<'_>, ValidationError> {
    Ok(Prepared::new(appends, render(appends, payload_max_bytes)?))
}

/// Validates `appends` and renders their canonical JSON, once: the result travels with the
/// appends (to a group committer, say) so nothing is rendered twice.
pub(crate) fn render(
    appends: &[StreamAppend],
    payload_max_bytes: usize,
) -> Result<Rendered, ValidationError> {
    check_shape(appends)?;
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
            let metadata = canonical_metadata(&event.metadata);
            if holds_nul(&payload, &event.payload) || holds_nul(&metadata, &event.metadata) {
                return Err(ValidationError::NulCharacter { event_id: event.event_id });
            }
            rendered.push((payload, metadata));
        }
        canonical.push(rendered);
    }
    Ok(canonical)
}

impl<'a> Prepared<'a> {
    /// Puts validated, rendered appends in lock order.
    pub(crate) fn new(appends: &'a [StreamAppend], canonical: Rendered) -> Self {
        let mut sorted: Vec<usize> = (0..appends.len()).collect();
        sorted.sort_by(|&a, &b| appends[a].stream_id.cmp(&appends[b].stream_id));
        let mut caller_order = vec![0; appends.len()];
        for (position, &caller) in sorted.iter().enumerate() {
            caller_order[caller] = position;
        }
        Prepared { appends, sorted, caller_order, canonical, ledger: None }
    }

    /// The same append, carrying a ledger row.
    pub(crate) fn with_ledger(self, ledger: Option<&'a LedgerEntry>) -> Self {
        Self { ledger, ..self }
    }
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
    for append in appends {
        if append.events.is_empty() {
            return Err(ValidationError::NoEventsForStream { stream: append.stream_id.clone() });
        }
        if !streams.insert(&append.stream_id) {
            return Err(ValidationError::DuplicateStream { stream: append.stream_id.clone() });
        }
    }
    // Sorted, a repeated id sits beside itself (cheaper than hashing every id).
    let mut event_ids: Vec<_> =
        appends.iter().flat_map(|a| a.events.iter().map(|e| e.event_id)).collect();
    event_ids.sort_unstable();
    match event_ids.windows(2).find(|pair| pair[0] == pair[1]) {
        Some(pair) => Err(ValidationError::DuplicateEventId { event_id: pair[0] }),
        None => Ok(()),
    }
}

/// The metadata object as canonical JSON; metadata without fields is `{}` without building a
/// map first.
fn canonical_metadata(metadata: &Metadata) -> String {
    if *metadata == Metadata::default() {
        return "{}".to_string();
    }
    to_canonical_json(&serde_json::to_value(metadata).unwrap_or(Value::Null))
}

/// Whether a value, rendered as `canonical`, holds U+0000, which PostgreSQL's `jsonb` cannot
/// hold in a string or in a key. Canonical JSON writes U+0000 as `\u0000`, so a rendering
/// without that text has none, and only the rare one with it (a NUL, or a literal backslash
/// before `u0000`) is walked.
fn holds_nul(canonical: &str, value: &impl serde::Serialize) -> bool {
    canonical.contains("\\u0000")
        && serde_json::to_value(value).is_ok_and(|value| contains_nul(&value))
}

/// Whether `value` holds U+0000 anywhere, in a string or in a key.
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
        let group = [(&prepared, vec![Head::EMPTY, b_head])];
        let e = encode(&group, Utc::now());
        assert_eq!(e.streams, ["a", "b"]);
        assert_eq!(e.entry_stream, [1, 2]);
        assert_eq!(e.entry_expected, [0, 4]);
        assert_eq!(e.event_entry, [2, 2, 1]);
        // Entry 1 (a) holds the third event, entry 2 (b) the first two.
        assert_eq!(e.entry_first, [3, 1]);
        assert_eq!(e.entry_events, [1, 2]);
        assert_eq!(e.entry_head, [GENESIS_HASH, [7; 32]]);
        assert_eq!(e.event_payloads, ["1", "2", "3"]);
        let a_head = Head { version: 1, hash: e.event_hashes[2] };
        let b_head = Head { version: 6, hash: e.event_hashes[1] };
        assert_eq!(e.new_heads, [vec![a_head, b_head]]);
        // Each hash covers the one before it: the same events from another head differ.
        let other = encode(
            &[(&prepared, vec![Head::EMPTY, Head { version: 4, hash: [8; 32] }])],
            e.recorded_at,
        );
        assert_ne!(other.event_hashes[0], e.event_hashes[0]);
        assert_ne!(other.event_hashes[1], e.event_hashes[1]);
        assert_eq!(other.event_hashes[2], e.event_hashes[2]);
    }

    #[test]
    fn a_group_shares_one_stream_list_and_numbers_its_appends() {
        let first = vec![append("b", ExpectedVersion::NoStream, vec![event(json!(1))])];
        let second = vec![
            append("c", ExpectedVersion::NoStream, vec![event(json!(2))]),
            append("b", ExpectedVersion::Exact(1), vec![event(json!(3))]),
        ];
        let (p1, p2) = (prepare(&first, 64).unwrap(), prepare(&second, 64).unwrap());
        let b1 = Head { version: 1, hash: [1; 32] };
        let group = [(&p1, vec![Head::EMPTY]), (&p2, vec![b1, Head::EMPTY])];
        let e = encode(&group, Utc::now());
        assert_eq!(e.streams, ["b", "c"]);
        assert_eq!(e.entry_append, [1, 2, 2]);
        assert_eq!(e.entry_stream, [1, 1, 2]);
        // The second append's events: c's (entry 3) then b's (entry 2), in caller order.
        assert_eq!(e.event_entry, [1, 3, 2]);
        assert_eq!(e.entry_first, [1, 3, 2]);
        assert_eq!(e.entry_events, [1, 1, 1]);
        assert_eq!(e.entry_expected, [0, 1, 0]);
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

    #[test]
    fn a_backslash_before_u0000_is_text_not_a_nul() {
        // Renders as `\\u0000`, which holds the text a NUL renders as.
        let text = [append("a", ExpectedVersion::Any, vec![event(json!({"k": "\\u0000"}))])];
        assert!(prepare(&text, 100).is_ok());
    }
}
