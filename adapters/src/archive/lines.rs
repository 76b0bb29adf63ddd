//! The lines of an export file, as serde types. Each line names its `kind` first, so a
//! reader dispatches on the line's start (`{"kind":"event",`) and parses it once.

use chrono::{DateTime, Utc};
use leasehold_domain::{Cursor, RecordedEvent};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use uuid::Uuid;

use super::ArchiveError;
use super::export::ExportFilter;

/// What every export file says it is.
pub const FORMAT: &str = "leasehold-events";

/// The version of the format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Whose view of the log a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// Every stored field: for auditors, verifiable and importable.
    Full,
    /// One tenant's own events as its tenant views show them: nothing to verify.
    Tenant,
}

/// The first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeaderLine {
    /// [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// When the export began.
    pub exported_at: DateTime<Utc>,
    /// Whose view.
    pub view: View,
    /// No filter: every event, every seal and every stream's head; importable.
    pub complete: bool,
    /// The filters that made it.
    pub filters: ExportFilter,
    /// Events that follow.
    pub events: u64,
    /// Seals that follow.
    pub seals: u64,
}

/// One event, every stored field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventLine {
    /// Its position in the log (the cursor's last part, for a reader's eyes).
    pub position: u64,
    /// Where it stands in the log's order: `(log_epoch, tx_id, position)`, 40 hex digits.
    #[serde(with = "cursor_text")]
    pub cursor: Cursor,
    /// The writer's id for it.
    pub event_id: Uuid,
    /// Its stream.
    pub stream_id: String,
    /// Its stream's type.
    pub stream_type: String,
    /// Its stream's owner.
    pub tenant_id: String,
    /// Its version in its stream.
    pub version: u64,
    /// Its type.
    pub event_type: String,
    /// Its payload's shape.
    pub schema_version: u32,
    /// Its payload, as stored.
    pub payload: Value,
    /// Its metadata, as stored.
    pub metadata: Value,
    /// When the log committed it.
    pub recorded_at: DateTime<Utc>,
    /// Its stream's previous event's hash.
    pub prev_hash: Hash32,
    /// Its hash.
    pub hash: Hash32,
}

impl EventLine {
    /// The line of an event as a reader of the log decoded it.
    pub fn of(event: &RecordedEvent) -> Self {
        Self {
            position: event.cursor.position,
            cursor: event.cursor,
            event_id: event.event_id.as_uuid(),
            stream_id: event.stream_id.as_str().to_owned(),
            stream_type: event.stream_type.as_str().to_owned(),
            tenant_id: event.tenant_id.as_str().to_owned(),
            version: event.version,
            event_type: event.event_type.as_str().to_owned(),
            schema_version: u32::from(event.schema_version),
            payload: event.payload.clone(),
            metadata: serde_json::to_value(&event.metadata).unwrap_or_default(),
            recorded_at: event.recorded_at,
            prev_hash: Hash32(event.prev_hash),
            hash: Hash32(event.hash),
        }
    }
}

/// An event's line borrowed from the event, written as [`EventLine`] writes it (same fields,
/// same order), without copying its payload and metadata first: the relay publishes one per
/// event.
#[derive(Debug, Serialize)]
pub struct EventLineRef<'a> {
    position: u64,
    #[serde(with = "cursor_text")]
    cursor: Cursor,
    event_id: Uuid,
    stream_id: &'a str,
    stream_type: &'a str,
    tenant_id: &'a str,
    version: u64,
    event_type: &'a str,
    schema_version: u32,
    payload: &'a Value,
    metadata: &'a leasehold_domain::Metadata,
    recorded_at: DateTime<Utc>,
    prev_hash: Hash32,
    hash: Hash32,
}

impl<'a> EventLineRef<'a> {
    /// The line of `event`.
    #[must_use]
    pub fn of(event: &'a RecordedEvent) -> Self {
        Self {
            position: event.cursor.position,
            cursor: event.cursor,
            event_id: event.event_id.as_uuid(),
            stream_id: event.stream_id.as_str(),
            stream_type: event.stream_type.as_str(),
            tenant_id: event.tenant_id.as_str(),
            version: event.version,
            event_type: event.event_type.as_str(),
            schema_version: u32::from(event.schema_version),
            payload: &event.payload,
            metadata: &event.metadata,
            recorded_at: event.recorded_at,
            prev_hash: Hash32(event.prev_hash),
            hash: Hash32(event.hash),
        }
    }
}

impl EventLine {
    /// The event as a reader of the log would have decoded it.
    ///
    /// # Errors
    /// [`ArchiveError::Malformed`] (of line `number`) for a name the log would not hold.
    pub fn recorded(&self, number: u64) -> Result<RecordedEvent, ArchiveError> {
        use leasehold_domain::{EventId, EventType, StreamId, StreamType, TenantId};
        let malformed = |reason: String| ArchiveError::Malformed { line: number, reason };
        let name = |error: leasehold_domain::IdError| malformed(error.to_string());
        Ok(RecordedEvent {
            cursor: self.cursor,
            event_id: EventId::from_uuid(self.event_id),
            stream_id: StreamId::parse(self.stream_id.clone()).map_err(name)?,
            stream_type: StreamType::parse(self.stream_type.clone()).map_err(name)?,
            tenant_id: TenantId::parse(self.tenant_id.clone()).map_err(name)?,
            version: self.version,
            event_type: EventType::parse(self.event_type.clone()).map_err(name)?,
            schema_version: u16::try_from(self.schema_version)
                .map_err(|_| malformed("schema_version out of range".into()))?,
            payload: self.payload.clone(),
            metadata: serde_json::from_value(self.metadata.clone())
                .map_err(|error| malformed(format!("metadata: {error}")))?,
            recorded_at: self.recorded_at,
            prev_hash: self.prev_hash.0,
            hash: self.hash.0,
        })
    }
}

/// An event line's fields but its JSON ones, borrowed from a row: written with the stored
/// JSON text of the payload and metadata passed through as it is ([`write_event_text`]),
/// never parsed into values and written again.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EventHead<'a> {
    pub(crate) position: u64,
    #[serde(with = "cursor_text")]
    pub(crate) cursor: Cursor,
    pub(crate) event_id: Uuid,
    pub(crate) stream_id: &'a str,
    pub(crate) stream_type: &'a str,
    pub(crate) tenant_id: &'a str,
    pub(crate) version: u64,
    pub(crate) event_type: &'a str,
    pub(crate) schema_version: u32,
    pub(crate) recorded_at: DateTime<Utc>,
    pub(crate) prev_hash: Hash32,
    pub(crate) hash: Hash32,
}

impl EventHead<'_> {
    /// The whole line, with its payload and metadata as values.
    pub(crate) fn with_json(self, payload: Value, metadata: Value) -> EventLine {
        EventLine {
            position: self.position,
            cursor: self.cursor,
            event_id: self.event_id,
            stream_id: self.stream_id.to_owned(),
            stream_type: self.stream_type.to_owned(),
            tenant_id: self.tenant_id.to_owned(),
            version: self.version,
            event_type: self.event_type.to_owned(),
            schema_version: self.schema_version,
            payload,
            metadata,
            recorded_at: self.recorded_at,
            prev_hash: self.prev_hash,
            hash: self.hash,
        }
    }
}

/// Writes one event line: `{"kind":"event",<head's fields>,"payload":<payload>,"metadata":
/// <metadata>}` and a newline; `payload` and `metadata` are JSON texts (as PostgreSQL gives a
/// `jsonb` out), written as they are. `buffer` is reused from line to line.
///
/// # Errors
/// When `out` fails.
pub(crate) fn write_event_text(
    out: &mut impl std::io::Write,
    buffer: &mut Vec<u8>,
    head: &EventHead<'_>,
    payload: &str,
    metadata: &str,
) -> std::io::Result<()> {
    buffer.clear();
    serde_json::to_writer(&mut *buffer, head)?;
    // `{<fields>}`: the fields alone, between the tag and the JSON ones.
    let fields = buffer.get(1..buffer.len().saturating_sub(1)).unwrap_or_default();
    out.write_all(b"{\"kind\":\"event\",")?;
    out.write_all(fields)?;
    out.write_all(b",\"payload\":")?;
    out.write_all(payload.as_bytes())?;
    out.write_all(b",\"metadata\":")?;
    out.write_all(metadata.as_bytes())?;
    out.write_all(b"}\n")
}

/// One event as its tenant sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantEventLine {
    /// Its stream.
    pub stream_id: String,
    /// Its stream's type.
    pub stream_type: String,
    /// Its version in its stream.
    pub version: u64,
    /// Its type.
    pub event_type: String,
    /// When the log committed it.
    pub recorded_at: DateTime<Utc>,
    /// Only the fields its event type's tenant view lists.
    pub payload: Value,
}

impl TenantEventLine {
    /// What the event's tenant sees of it: only the payload's fields its event type's tenant
    /// view lists (deny by default), and nothing of the log (no id, cursor or hash).
    pub fn of(line: EventLine) -> Self {
        let payload = leasehold_domain::registry::tenant_view(
            &line.stream_type,
            &line.event_type,
            &line.payload,
        );
        Self {
            stream_id: line.stream_id,
            stream_type: line.stream_type,
            version: line.version,
            event_type: line.event_type,
            recorded_at: line.recorded_at,
            payload,
        }
    }
}

/// One seal, as `ledger_seals` holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SealLine {
    /// Its number (from 1).
    pub seal_no: u64,
    /// The first event it covers.
    #[serde(with = "cursor_text")]
    pub first: Cursor,
    /// The last event it covers.
    #[serde(with = "cursor_text")]
    pub last: Cursor,
    /// The covered events' positions, in log order.
    pub positions: Vec<i64>,
    /// The covered events' hashes, concatenated in log order, in hex.
    #[serde(with = "hex_bytes")]
    pub hashes: Vec<u8>,
    /// The previous seal's digest.
    pub prev_digest: Hash32,
    /// `sha256(prev_digest || hashes)`.
    pub digest: Hash32,
    /// When it was written.
    pub sealed_at: DateTime<Utc>,
}

/// One stream's head, as the `streams` table records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamLine {
    /// The stream.
    pub stream_id: String,
    /// Its type.
    pub stream_type: String,
    /// Its owner.
    pub tenant_id: String,
    /// How many events it holds.
    pub version: u64,
    /// Its last event's hash.
    pub last_hash: Hash32,
    /// The transaction that last appended to it.
    pub last_tx_id: u64,
}

/// The last line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndLine {
    /// Events written.
    pub events: u64,
    /// Seals written.
    pub seals: u64,
    /// Stream heads written.
    pub streams: u64,
}

/// One line of a file.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// The first.
    Header(HeaderLine),
    /// An event (full view).
    Event(Box<EventLine>),
    /// A seal.
    Seal(Box<SealLine>),
    /// A stream's head.
    Stream(StreamLine),
    /// The last.
    End(EndLine),
}

/// How a line of each kind starts, as the writer writes it.
const PREFIXES: [(&str, LineKind); 5] = [
    ("{\"kind\":\"event\",", LineKind::Event),
    ("{\"kind\":\"seal\",", LineKind::Seal),
    ("{\"kind\":\"stream\",", LineKind::Stream),
    ("{\"kind\":\"header\",", LineKind::Header),
    ("{\"kind\":\"end\",", LineKind::End),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LineKind {
    Header,
    Event,
    Seal,
    Stream,
    End,
}

#[derive(Deserialize)]
struct KindOnly {
    kind: LineKind,
}

impl Line {
    /// Parses line `number` (from 1) of a file. Lines are dispatched on how they start;
    /// one written by another tool (keys in another order) is dispatched on its `kind`.
    ///
    /// # Errors
    /// [`ArchiveError::Malformed`] for a line that is not one of the format's.
    pub fn parse(number: u64, text: &str) -> Result<Self, ArchiveError> {
        let malformed = |error: serde_json::Error| ArchiveError::Malformed {
            line: number,
            reason: error.to_string(),
        };
        let kind = match PREFIXES.iter().find(|(prefix, _)| text.starts_with(prefix)) {
            Some((_, kind)) => *kind,
            None => serde_json::from_str::<KindOnly>(text).map_err(malformed)?.kind,
        };
        Ok(match kind {
            LineKind::Header => Self::Header(serde_json::from_str(text).map_err(malformed)?),
            LineKind::Event => Self::Event(serde_json::from_str(text).map_err(malformed)?),
            LineKind::Seal => Self::Seal(serde_json::from_str(text).map_err(malformed)?),
            LineKind::Stream => Self::Stream(serde_json::from_str(text).map_err(malformed)?),
            LineKind::End => Self::End(serde_json::from_str(text).map_err(malformed)?),
        })
    }
}

/// Writes `line` as one line of a file: `{"kind":"<kind>",<its fields>}` and a newline.
///
/// # Errors
/// When `out` fails.
pub(crate) fn write_line<T: Serialize>(
    out: &mut impl std::io::Write,
    kind: &str,
    line: &T,
) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Tagged<'a, T> {
        kind: &'a str,
        #[serde(flatten)]
        line: &'a T,
    }
    serde_json::to_writer(&mut *out, &Tagged { kind, line })?;
    out.write_all(b"\n")
}

/// A SHA-256 digest, in hex on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hash32(pub [u8; 32]);

impl Serialize for Hash32 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut text = [0u8; 64];
        hex::encode_to_slice(self.0, &mut text).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for Hash32 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        let mut bytes = [0u8; 32];
        if !decode_hex(text.as_bytes(), &mut bytes) {
            return Err(serde::de::Error::custom("a hash is 64 hex digits"));
        }
        Ok(Self(bytes))
    }
}

/// A cursor as its 40 hex digits.
pub(crate) mod cursor_text {
    use leasehold_domain::Cursor;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        cursor: &Cursor,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(cursor)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Cursor, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(|_| serde::de::Error::custom("a cursor is 40 hex digits"))
    }
}

/// Bytes in hex.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        let mut bytes = vec![0; text.len() / 2];
        if !super::decode_hex(text.as_bytes(), &mut bytes) {
            return Err(serde::de::Error::custom("not hex"));
        }
        Ok(bytes)
    }
}

/// Each byte's value as a hex digit, or `0xff`.
const NIBBLES: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut at = 0;
    while at < 10 {
        table[b'0' as usize + at] = at as u8;
        at += 1;
    }
    let mut at = 0;
    while at < 6 {
        table[b'a' as usize + at] = 10 + at as u8;
        table[b'A' as usize + at] = 10 + at as u8;
        at += 1;
    }
    table
};

/// Decodes `text` (two hex digits a byte) into `out`, exactly filling it; false if it is not
/// that. A seal line holds a thousand hashes: `hex::decode`'s iterator took a fifth of an
/// import's time reading them.
fn decode_hex(text: &[u8], out: &mut [u8]) -> bool {
    if text.len() != out.len() * 2 {
        return false;
    }
    let mut bad = 0;
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let (high, low) = (NIBBLES[usize::from(pair[0])], NIBBLES[usize::from(pair[1])]);
        bad |= high | low;
        *byte = high << 4 | low;
    }
    bad & 0xf0 == 0
}

/// Cursors in filters, as their text (`None` stays `null`).
pub(crate) mod optional_cursor {
    use leasehold_domain::Cursor;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        cursor: &Option<Cursor>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match cursor {
            Some(cursor) => serializer.collect_str(cursor),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Cursor>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        text.map(|text| {
            text.parse().map_err(|_| serde::de::Error::custom("a cursor is 40 hex digits"))
        })
        .transpose()
    }
}

#[cfg(test)]
mod hex_tests {
    use super::decode_hex;

    #[test]
    fn hex_decodes_both_cases_and_refuses_anything_else() {
        let mut out = [0; 4];
        assert!(decode_hex(b"00fFa9B1", &mut out));
        assert_eq!(out, [0x00, 0xff, 0xa9, 0xb1]);
        for bad in [&b"00fFa9B"[..], b"00fFa9B1cc", b"00fFa9Bg", b"0 fFa9B1", b"\xfffFa9B1"] {
            assert!(!decode_hex(bad, &mut out), "{bad:?}");
        }
    }
}
