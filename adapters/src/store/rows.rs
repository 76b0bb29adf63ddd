//! Reading event rows back into [`RecordedEvent`]s.

use leasehold_domain::{
    Cursor, EventId, EventType, Metadata, RecordedEvent, StoreError, StreamId, StreamType, TenantId,
};
use tokio_postgres::Row;
use tokio_postgres::types::Json;

use super::xid8::Xid8;

/// The columns every event read selects, in the order [`decode`] expects.
pub(crate) const EVENT_COLUMNS: &str = "log_epoch, tx_id, position, event_id, \
     stream_id, stream_type, tenant_id, version, event_type, schema_version, payload, metadata, \
     recorded_at, prev_hash, hash";

fn corrupt(position: u64, reason: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { position, reason: reason.to_string() }
}

fn unsigned(position: u64, value: i64, column: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| corrupt(position, format!("negative {column}")))
}

fn hash(position: u64, bytes: &[u8], column: &str) -> Result<[u8; 32], StoreError> {
    bytes.try_into().map_err(|_| corrupt(position, format!("{column} is not 32 bytes")))
}

/// The cursor of a row whose first columns are `log_epoch, tx_id, position` (as in
/// [`EVENT_COLUMNS`]), without decoding the rest of it. Epochs and positions are positive by
/// construction (a column default and an identity), so the conversions lose nothing.
pub(crate) fn cursor_of(row: &Row) -> Cursor {
    Cursor {
        log_epoch: u32::try_from(row.get::<_, i32>(0)).unwrap_or_default(),
        tx_id: row.get::<_, Xid8>(1).0,
        position: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
    }
}

/// Decodes one row selected with [`EVENT_COLUMNS`].
pub(crate) fn decode(row: &Row) -> Result<RecordedEvent, StoreError> {
    let cursor = cursor_of(row);
    let position = cursor.position;
    let name_error = |e: leasehold_domain::IdError| corrupt(position, e);
    let Json(metadata): Json<Metadata> =
        row.try_get(11).map_err(|e| corrupt(position, format!("metadata: {e}")))?;
    let schema_version: i32 = row.get(9);
    Ok(RecordedEvent {
        cursor,
        event_id: EventId::from_uuid(row.get(3)),
        stream_id: StreamId::parse(row.get::<_, String>(4)).map_err(name_error)?,
        stream_type: StreamType::parse(row.get::<_, String>(5)).map_err(name_error)?,
        tenant_id: TenantId::parse(row.get::<_, String>(6)).map_err(name_error)?,
        version: unsigned(position, row.get(7), "version")?,
        event_type: EventType::parse(row.get::<_, String>(8)).map_err(name_error)?,
        schema_version: u16::try_from(schema_version)
            .map_err(|_| corrupt(position, "schema version out of range"))?,
        payload: row.get::<_, Json<serde_json::Value>>(10).0,
        metadata,
        recorded_at: row.get(12),
        prev_hash: hash(position, row.get(13), "prev_hash")?,
        hash: hash(position, row.get(14), "hash")?,
    })
}
