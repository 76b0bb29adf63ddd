//! A relay's checkpoint: the last event every event up to which was acknowledged.

use chrono::{DateTime, Utc};
use leasehold_domain::{Cursor, StoreError};

use super::lock::RelayLock;
use crate::store::{PgEventStore, Xid8, cursor_of, to_i64};

/// Where a relay stands, as `relay_checkpoints` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayCheckpoint {
    /// The relay (`kafka:<topic>`).
    pub relay: String,
    /// The last event acknowledged, with every event before it.
    pub cursor: Cursor,
    /// Events acknowledged since the relay first ran.
    pub published: u64,
    /// Publishing failures so far.
    pub publish_errors: u64,
    /// The last failure, until the relay publishes again.
    pub last_error: Option<String>,
    /// When it last moved (a failure leaves it: the lag's seconds count on from there).
    pub updated_at: DateTime<Utc>,
}

/// The cursor's columns first, as [`cursor_of`] reads them.
const LOAD_SQL: &str = "SELECT log_epoch, tx_id, position, relay, published, publish_errors, \
     last_error, updated_at FROM relay_checkpoints WHERE $1::text IS NULL OR relay = $1 \
     ORDER BY relay";

const SAVE_SQL: &str = "INSERT INTO relay_checkpoints \
     (relay, log_epoch, tx_id, position, published) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (relay) DO UPDATE SET log_epoch = $2, tx_id = $3, position = $4, \
       published = relay_checkpoints.published + $5, last_error = NULL, updated_at = now()";

const FAILED_SQL: &str = "INSERT INTO relay_checkpoints \
     (relay, log_epoch, tx_id, position, publish_errors, last_error) \
     VALUES ($1, 0, '0'::xid8, 0, 1, $2) \
     ON CONFLICT (relay) DO UPDATE SET publish_errors = relay_checkpoints.publish_errors + 1, \
       last_error = $2";

/// Every relay's checkpoint, or `relay`'s.
///
/// # Errors
/// [`StoreError`] when the database fails.
pub async fn relay_checkpoints(
    store: &PgEventStore,
    relay: Option<&str>,
) -> Result<Vec<RelayCheckpoint>, StoreError> {
    Ok(rows_to_checkpoints(&store.query(LOAD_SQL, &[&relay]).await?))
}

/// Where relay `name` (whose lock is held) starts: its checkpoint, listed at the log's start
/// first if it has none yet (its lag shown before the broker acknowledges anything).
pub(super) async fn start(lock: &RelayLock, name: &str) -> Result<Cursor, StoreError> {
    let register = "INSERT INTO relay_checkpoints (relay, log_epoch, tx_id, position) \
                    VALUES ($1, 0, '0'::xid8, 0) ON CONFLICT (relay) DO NOTHING";
    lock.query(register, &[&name]).await?;
    let name = Some(name);
    let checkpoint = rows_to_checkpoints(&lock.query(LOAD_SQL, &[&name]).await?);
    Ok(checkpoint.first().map_or(Cursor::START, |checkpoint| checkpoint.cursor))
}

fn rows_to_checkpoints(rows: &[tokio_postgres::Row]) -> Vec<RelayCheckpoint> {
    rows.iter()
        .map(|row| {
            let count = |at: usize| u64::try_from(row.get::<_, i64>(at)).unwrap_or_default();
            RelayCheckpoint {
                cursor: cursor_of(row),
                relay: row.get(3),
                published: count(4),
                publish_errors: count(5),
                last_error: row.get(6),
                updated_at: row.get(7),
            }
        })
        .collect()
}

/// Moves `relay`'s checkpoint to `cursor`, `acknowledged` more events published.
pub(super) async fn save(
    lock: &RelayLock,
    relay: &str,
    cursor: Cursor,
    acknowledged: u64,
) -> Result<(), StoreError> {
    let epoch = i32::try_from(cursor.log_epoch).unwrap_or(i32::MAX);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
        [&relay, &epoch, &Xid8(cursor.tx_id), &to_i64(cursor.position), &to_i64(acknowledged)];
    lock.query(SAVE_SQL, &params).await.map(|_| ())
}

/// Records that `relay` failed, and why (no event's content: the reason is the producer's).
pub(super) async fn failed(lock: &RelayLock, relay: &str, reason: &str) -> Result<(), StoreError> {
    lock.query(FAILED_SQL, &[&relay, &reason]).await.map(|_| ())
}
