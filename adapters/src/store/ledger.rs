//! The command pipeline's storage: the idempotency ledger and snapshots, beside the log.

use leasehold_commands::{CommandStore, Recorded};
use leasehold_domain::{
    AppendOutcome, Cursor, LedgerEntry, RequestHash, StoreError, StreamAppend, StreamId,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::Row;

use super::rows::cursor_of;
use super::{PgEventStore, to_i64};

/// A ledger row with its events' types and the cursor it answered: its append's last event
/// (which may be on a linked stream), or for a command that changed nothing the stream's last
/// event (NULL columns on an empty stream). The cursor columns come first.
const RECORDED_SQL: &str = "SELECT c.log_epoch, c.tx_id, c.position, l.request_hash, \
     l.stream_id, l.last_version, \
     (SELECT coalesce(array_agg(e.event_type ORDER BY e.version), '{}') FROM events e \
       WHERE e.stream_id = l.stream_id AND e.version BETWEEN l.first_version AND l.last_version) \
     FROM idempotency l \
     LEFT JOIN events c ON c.stream_id = coalesce(l.cursor_stream_id, l.stream_id) \
      AND c.version = coalesce(l.cursor_version, l.last_version) \
     WHERE l.tenant_id = $1 AND l.namespace = $2 AND l.operation_key = $3";

const UNCHANGED_SQL: &str = "INSERT INTO idempotency (tenant_id, namespace, operation_key, \
     request_hash, stream_id, first_version, last_version) \
     VALUES ($1, $2, $3, $4, $5, $6::bigint + 1, $6::bigint) ON CONFLICT DO NOTHING";

const CURSOR_AT_SQL: &str =
    "SELECT log_epoch, tx_id, position FROM events WHERE stream_id = $1 AND version = $2";

fn recorded_of(row: &Row) -> Result<Recorded, StoreError> {
    let hash: &[u8] = row.get(3);
    let request_hash = hash.try_into().map(RequestHash).map_err(|_| StoreError::Corrupt {
        position: 0,
        reason: "a ledger row's request hash is not 32 bytes".into(),
    })?;
    let stream = StreamId::parse(row.get::<_, String>(4))
        .map_err(|e| StoreError::Corrupt { position: 0, reason: e.to_string() })?;
    let has_cursor = row.get::<_, Option<i32>>(0).is_some();
    Ok(Recorded {
        request_hash,
        stream,
        version: u64::try_from(row.get::<_, i64>(5)).unwrap_or_default(),
        cursor: has_cursor.then(|| cursor_of(row)),
        event_types: row.get(6),
    })
}

impl CommandStore for PgEventStore {
    async fn recorded(&self, ledger: &LedgerEntry) -> Result<Option<Recorded>, StoreError> {
        let key = [
            &ledger.tenant.as_str() as &(dyn tokio_postgres::types::ToSql + Sync),
            &ledger.namespace.as_str(),
            &ledger.operation_key.as_str(),
        ];
        let rows = self.query(RECORDED_SQL, &key).await?;
        rows.first().map(recorded_of).transpose()
    }

    async fn append_recorded(
        &self,
        appends: Vec<StreamAppend>,
        ledger: LedgerEntry,
    ) -> Result<AppendOutcome, StoreError> {
        PgEventStore::append_recorded(self, appends, ledger).await
    }

    async fn record_unchanged(
        &self,
        ledger: LedgerEntry,
        version: u64,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let endpoint = self.endpoint();
        let statement = client
            .prepare_cached(UNCHANGED_SQL)
            .await
            .map_err(|e| super::errors::from_driver(e, endpoint))?;
        let inserted = client
            .execute(
                &statement,
                &[
                    &ledger.tenant.as_str(),
                    &ledger.namespace.as_str(),
                    &ledger.operation_key.as_str(),
                    &ledger.request_hash.0.as_slice(),
                    &ledger.stream.as_str(),
                    &to_i64(version),
                ],
            )
            .await
            .map_err(|e| super::errors::from_driver(e, endpoint))?;
        Ok(inserted == 1)
    }

    async fn cursor_at(
        &self,
        stream: &StreamId,
        version: u64,
    ) -> Result<Option<Cursor>, StoreError> {
        let rows = self.query(CURSOR_AT_SQL, &[&stream.as_str(), &to_i64(version)]).await?;
        Ok(rows.first().map(cursor_of))
    }

    async fn snapshot<T: DeserializeOwned + Send>(
        &self,
        stream: &StreamId,
        state_schema: u32,
    ) -> Result<Option<(u64, T)>, StoreError> {
        let snapshot = self.load_snapshot::<T>(stream, state_schema).await?;
        Ok(snapshot.map(|snapshot| (snapshot.version, snapshot.state)))
    }

    async fn save_snapshot<T: Serialize + Sync>(
        &self,
        stream: &StreamId,
        version: u64,
        state_schema: u32,
        state: &T,
    ) -> Result<(), StoreError> {
        PgEventStore::save_snapshot(self, stream, version, state_schema, state).await
    }
}
