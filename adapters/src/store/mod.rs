//! The PostgreSQL event store.
//!
//! Appends go through one SQL function, `leasehold_append` (schema/postgres/0002_append.sql):
//! one round trip that locks the streams, checks versions, chains hashes and inserts every
//! event in one statement. Whole-log reads use the transaction-id horizon, so an event whose
//! transaction commits late is never skipped: everything after it waits until it commits.

mod encode;
mod errors;
mod rows;
mod tail;

use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool};
use leasehold_domain::limits::{PAYLOAD_DEFAULT_MAX_BYTES, READ_PAGE_EVENTS_MAX};
use leasehold_domain::{
    AppendOutcome, Cursor, EventStore, LogPage, RecordedEvent, StoreError, StreamAppend, StreamId,
    ValidationError,
};
use tokio::sync::Notify;
use tokio_postgres::Row;

use crate::database::{DatabaseUrl, DatabaseUrlError};
use crate::limits::{APPEND_RETRIES_MAX, POOL_DEFAULT_SIZE};
use encode::{EncodedAppend, encode};
use errors::{AttemptError, classify_append, from_driver, from_pool};
pub(crate) use rows::EVENT_COLUMNS;

const APPEND_SQL: &str = "SELECT r_outcome, r_log_epoch, r_tx_id, r_position, r_stream, \
     r_expected, r_actual, r_versions FROM leasehold_append($1::text[], $2::text[], $3::text[], \
     $4::bigint[], $5::uuid[], $6::int4[], $7::text[], $8::int4[], $9::text[], $10::text[], $11::bool)";

/// Rows a whole-log reader may see: every earlier epoch, and in the current one only rows of
/// transactions older than the oldest transaction still running.
const HORIZON: &str = "(log_epoch < (SELECT current_epoch FROM log_meta) \
     OR tx_id < pg_snapshot_xmin(pg_current_snapshot()))";

/// Settings of the event store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Largest payload of one event, as canonical JSON, in bytes.
    pub payload_max_bytes: usize,
    /// Most pooled connections.
    pub pool_size: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { payload_max_bytes: PAYLOAD_DEFAULT_MAX_BYTES, pool_size: POOL_DEFAULT_SIZE }
    }
}

/// The event log on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgEventStore {
    pool: Pool,
    endpoint: String,
    config: StoreConfig,
    appended: Arc<Notify>,
}

impl PgEventStore {
    /// A store over the database at `url`. Connects lazily; run the migrations first.
    pub fn new(url: &DatabaseUrl, config: StoreConfig) -> Result<Self, DatabaseUrlError> {
        let pool = url.pool(config.pool_size)?;
        Ok(Self { pool, endpoint: url.endpoint(), config, appended: Arc::new(Notify::new()) })
    }

    /// `host:port` of the database, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The connection pool, shared with the rest of the process.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Notified after every append this process commits: tailing readers wait on it.
    pub fn appended(&self) -> Arc<Notify> {
        Arc::clone(&self.appended)
    }

    /// Wakes this process's tailing readers. Call it after committing a transaction that
    /// used [`PgEventStore::append_in`]; autocommit appends call it themselves.
    pub fn notify_appended(&self) {
        self.appended.notify_waiters();
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| from_pool(e, &self.endpoint))
    }

    /// Appends inside the caller's transaction, so that other rows (an idempotency record, a
    /// read model) commit atomically with the events. Call it before the transaction writes
    /// anything else, so its stream locks are taken before the transaction gets its id.
    /// A collision with a concurrent transaction is [`StoreError::TransactionConflict`]: roll
    /// back and run the whole transaction again.
    pub async fn append_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        appends: &[StreamAppend],
    ) -> Result<AppendOutcome, StoreError> {
        let encoded = encode(appends, self.config.payload_max_bytes)?;
        match self.attempt(tx, appends, &encoded, false).await {
            Ok(outcome) => Ok(outcome),
            // Either way the transaction is aborted: the caller must run it again.
            Err(AttemptError::Retry | AttemptError::RetryCheckingEventIds) => {
                Err(StoreError::TransactionConflict)
            }
            Err(AttemptError::Fail(error)) => Err(error),
        }
    }

    async fn attempt<C: GenericClient>(
        &self,
        client: &C,
        appends: &[StreamAppend],
        e: &EncodedAppend,
        check_event_ids: bool,
    ) -> Result<AppendOutcome, AttemptError> {
        let fail = |error| AttemptError::Fail(from_driver(error, &self.endpoint));
        let statement = client.prepare_cached(APPEND_SQL).await.map_err(fail)?;
        let row = client
            .query_one(
                &statement,
                &[
                    &e.stream_ids,
                    &e.stream_types,
                    &e.tenant_ids,
                    &e.expected,
                    &e.event_ids,
                    &e.event_streams,
                    &e.event_types,
                    &e.schema_versions,
                    &e.payloads,
                    &e.metadata,
                    &check_event_ids,
                ],
            )
            .await
            .map_err(|error| classify_append(error, &self.endpoint))?;
        outcome(&row, appends, e).map_err(AttemptError::Fail)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.client().await?;
        let statement =
            client.prepare_cached(sql).await.map_err(|e| from_driver(e, &self.endpoint))?;
        client.query(&statement, params).await.map_err(|e| from_driver(e, &self.endpoint))
    }
}

/// Turns the function's result row into the append's outcome.
fn outcome(
    row: &Row,
    appends: &[StreamAppend],
    e: &EncodedAppend,
) -> Result<AppendOutcome, StoreError> {
    let kind: &str = row.get(0);
    let stream_named = |row: &Row| {
        let id: &str = row.get(4);
        appends
            .iter()
            .find(|a| a.stream_id.as_str() == id)
            .map(|a| (a.stream_id.clone(), a.expected))
    };
    match kind {
        "appended" | "duplicate" => {
            let cursor = Cursor {
                log_epoch: u32::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
                tx_id: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
                position: u64::try_from(row.get::<_, i64>(3)).unwrap_or_default(),
            };
            let versions: Vec<Option<i64>> = row.get(7);
            let stream_versions = appends
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let version = versions.get(e.caller_order[i]).copied().flatten().unwrap_or(0);
                    (a.stream_id.clone(), u64::try_from(version).unwrap_or_default())
                })
                .collect();
            Ok(AppendOutcome { cursor, stream_versions, duplicate: kind == "duplicate" })
        }
        "wrong_expected_version" => {
            let (stream, expected) = stream_named(row).ok_or(StoreError::Database {
                reason: "leasehold_append named a stream the append did not".into(),
            })?;
            let actual = u64::try_from(row.get::<_, i64>(6)).unwrap_or_default();
            Err(StoreError::WrongExpectedVersion { stream, expected, actual })
        }
        "event_id_conflict" => Err(StoreError::EventIdConflict),
        "stream_ownership" => match stream_named(row) {
            Some((stream, _)) => Err(StoreError::StreamOwnership { stream }),
            None => Err(StoreError::Database { reason: "unknown stream in outcome".into() }),
        },
        other => Err(StoreError::Database { reason: format!("unknown append outcome {other}") }),
    }
}

fn page_limit(limit: usize) -> Result<i64, StoreError> {
    if limit == 0 || limit > READ_PAGE_EVENTS_MAX {
        return Err(
            ValidationError::PageSize { requested: limit, max: READ_PAGE_EVENTS_MAX }.into()
        );
    }
    Ok(i64::try_from(limit).unwrap_or(i64::MAX))
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn decode_all(rows: &[Row]) -> Result<Vec<RecordedEvent>, StoreError> {
    rows.iter().map(rows::decode).collect()
}

impl EventStore for PgEventStore {
    async fn append(&self, appends: Vec<StreamAppend>) -> Result<AppendOutcome, StoreError> {
        let encoded = encode(&appends, self.config.payload_max_bytes)?;
        let client = self.client().await?;
        let mut check_event_ids = false;
        for _ in 0..APPEND_RETRIES_MAX {
            match self.attempt(&client, &appends, &encoded, check_event_ids).await {
                Ok(outcome) => {
                    if !outcome.duplicate {
                        self.notify_appended();
                    }
                    return Ok(outcome);
                }
                Err(AttemptError::Retry) => continue,
                // The next attempt tells a retry (duplicate) from a reuse (conflict).
                Err(AttemptError::RetryCheckingEventIds) => check_event_ids = true,
                Err(AttemptError::Fail(error)) => return Err(error),
            }
        }
        Err(StoreError::TransactionConflict)
    }

    async fn read_stream(
        &self,
        stream: &StreamId,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let limit = page_limit(limit)?;
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = $1 AND version >= $2 \
             ORDER BY version LIMIT $3"
        );
        let rows = self.query(&sql, &[&stream.as_str(), &to_i64(from_version), &limit]).await?;
        decode_all(&rows)
    }

    async fn read_log(&self, after: Cursor, limit: usize) -> Result<LogPage, StoreError> {
        let limit = page_limit(limit)?;
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events \
             WHERE (log_epoch, tx_id, position) > ($1, ($2::bigint)::text::xid8, $3) AND {HORIZON} \
             ORDER BY log_epoch, tx_id, position LIMIT $4"
        );
        let epoch = i32::try_from(after.log_epoch).unwrap_or(i32::MAX);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&epoch, &to_i64(after.tx_id), &to_i64(after.position), &limit];
        let events = decode_all(&self.query(&sql, &params).await?)?;
        let next = events.last().map_or(after, |event| event.cursor);
        Ok(LogPage { events, next })
    }

    async fn head(&self) -> Result<Cursor, StoreError> {
        let sql = format!(
            "SELECT log_epoch, tx_id::text::bigint, position FROM events WHERE {HORIZON} \
             ORDER BY log_epoch DESC, tx_id DESC, position DESC LIMIT 1"
        );
        let rows = self.query(&sql, &[]).await?;
        Ok(rows.first().map_or(Cursor::START, |row| Cursor {
            log_epoch: u32::try_from(row.get::<_, i32>(0)).unwrap_or_default(),
            tx_id: u64::try_from(row.get::<_, i64>(1)).unwrap_or_default(),
            position: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
        }))
    }
}
