//! Aggregate snapshots: an aggregate's state at a stream version, postcard-encoded, so a
//! loader reads the snapshot plus the tail of the stream instead of the whole stream.
//!
//! Each snapshot records the `state_schema` of the state type it encodes. A loader asking for
//! another schema gets nothing (it rebuilds from events); snapshots are a cache, never a source
//! of truth, and events never use this encoding.

use leasehold_domain::{StoreError, StreamId};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::{PgEventStore, to_i64};

/// A loaded snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<T> {
    /// The stream version the state reflects.
    pub version: u64,
    /// The state.
    pub state: T,
}

impl PgEventStore {
    /// Stores `state` as the snapshot of `stream` at `version`, unless a snapshot of a later
    /// version of the same schema is already stored.
    pub async fn save_snapshot<T: Serialize>(
        &self,
        stream: &StreamId,
        version: u64,
        state_schema: u32,
        state: &T,
    ) -> Result<(), StoreError> {
        let bytes = postcard::to_stdvec(state)
            .map_err(|e| StoreError::Database { reason: format!("encoding a snapshot: {e}") })?;
        let schema = i32::try_from(state_schema).unwrap_or(i32::MAX);
        let version = to_i64(version);
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO snapshots (stream_id, version, state_schema, state) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (stream_id) DO UPDATE \
                 SET version = excluded.version, state_schema = excluded.state_schema, \
                     state = excluded.state, taken_at = now() \
                 WHERE snapshots.version < excluded.version \
                    OR snapshots.state_schema <> excluded.state_schema",
                &[&stream.as_str(), &version, &schema, &bytes],
            )
            .await
            .map_err(|e| StoreError::Database { reason: e.to_string() })?;
        Ok(())
    }

    /// The snapshot of `stream`, if one of `state_schema` is stored.
    pub async fn load_snapshot<T: DeserializeOwned>(
        &self,
        stream: &StreamId,
        state_schema: u32,
    ) -> Result<Option<Snapshot<T>>, StoreError> {
        let schema = i32::try_from(state_schema).unwrap_or(i32::MAX);
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT version, state FROM snapshots WHERE stream_id = $1 AND state_schema = $2",
                &[&stream.as_str(), &schema],
            )
            .await
            .map_err(|e| StoreError::Database { reason: e.to_string() })?;
        let Some(row) = row else { return Ok(None) };
        let version = u64::try_from(row.get::<_, i64>(0)).unwrap_or_default();
        let bytes: &[u8] = row.get(1);
        // The same schema number with undecodable bytes is a bug in whoever bumped (or forgot
        // to bump) the schema: report it rather than silently rebuilding.
        let state = postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt {
            position: 0,
            reason: format!("snapshot of {stream} at version {version}: {e}"),
        })?;
        Ok(Some(Snapshot { version, state }))
    }
}
