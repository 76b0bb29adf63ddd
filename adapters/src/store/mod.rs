//! The PostgreSQL event store.
//!
//! Appends go through one SQL function, `leasehold_append` (schema/postgres/0002_append.sql):
//! this process numbers and hash-chains the events from the stream heads it believes in, and
//! the function, in one round trip, locks the streams, checks those beliefs and inserts every
//! event in one statement. Whole-log reads use the transaction-id horizon, so an event whose
//! transaction commits late is never skipped: everything after it waits until it commits.

mod append;
mod catch_up;
mod epoch;
mod errors;
mod group;
mod heads;
mod ledger;
mod prepare;
mod rows;
mod seal;
mod single;
mod tail;
mod xid8;

use std::sync::{Arc, OnceLock};

use deadpool_postgres::Pool;
use leasehold_domain::limits::{PAYLOAD_DEFAULT_MAX_BYTES, READ_PAGE_EVENTS_MAX};
use leasehold_domain::{
    AppendOutcome, Cursor, EventStore, LedgerEntry, LogPage, RecordedEvent, StoreError,
    StreamAppend, StreamId, ValidationError,
};
use tokio::sync::Notify;
use tokio_postgres::Row;

use crate::database::{DatabaseUrl, DatabaseUrlError};
use crate::limits::{COMMITTERS_DEFAULT, GROUP_EVENTS_PER_APPEND_MAX, POOL_DEFAULT_SIZE};
pub(crate) use epoch::raise_epoch_in;
pub(crate) use errors::from_driver;
pub(crate) use errors::from_pool;
use heads::HeadCache;
use prepare::{Head, Prepared, render};
pub(crate) use rows::{EVENT_COLUMNS, cursor_of};
pub use seal::Seal;
pub(crate) use xid8::Xid8;

// ORDER BY names the table's columns, so that no select-list expression of the same name can
// ever replace them and stop the sort from walking the index.

/// Rows a whole-log reader may see: every earlier epoch, and in the current one only rows of
/// transactions older than the oldest transaction still running. Written as one row
/// comparison so that it bounds the index scan instead of filtering rows; both bounds are
/// subqueries, computed once per statement.
pub(crate) const HORIZON: &str = "(log_epoch, tx_id) < ((SELECT current_epoch FROM log_meta), \
     (SELECT pg_snapshot_xmin(pg_current_snapshot())))";

/// Settings of the event store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Largest payload of one event, as canonical JSON, in bytes.
    pub payload_max_bytes: usize,
    /// Most pooled connections.
    pub pool_size: usize,
    /// Worker tasks that commit concurrent appends in groups (0: every append commits alone).
    pub committers: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            payload_max_bytes: PAYLOAD_DEFAULT_MAX_BYTES,
            pool_size: POOL_DEFAULT_SIZE,
            committers: COMMITTERS_DEFAULT,
        }
    }
}

/// The event log on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgEventStore {
    pool: Pool,
    endpoint: String,
    config: StoreConfig,
    appended: Arc<Notify>,
    heads: Arc<HeadCache>,
    group: Arc<OnceLock<tokio::sync::mpsc::Sender<group::Request>>>,
}

impl PgEventStore {
    /// A store over the database at `url`. Connects lazily; run the migrations first.
    pub fn new(url: &DatabaseUrl, config: StoreConfig) -> Result<Self, DatabaseUrlError> {
        let pool = url.pool(config.pool_size)?;
        Ok(Self {
            pool,
            endpoint: url.endpoint(),
            config,
            appended: Arc::new(Notify::new()),
            heads: Arc::default(),
            group: Arc::default(),
        })
    }

    /// `host:port` of the database, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The same store without the group committers' queue: what the committers themselves
    /// use, so that they stop once every other handle is dropped.
    fn without_committers(&self) -> Self {
        Self { group: Arc::default(), ..self.clone() }
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

    /// Whether the database answers and every embedded migration is applied unchanged: what
    /// `/readyz` reports. A schema it cannot read counts as not current.
    ///
    /// # Errors
    /// When the database cannot be reached.
    pub async fn migrations_current(&self) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        Ok(crate::migrations::is_current(&mut client).await.unwrap_or(false))
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| from_pool(e, &self.endpoint))
    }

    pub(crate) async fn query(
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

/// A read-only transaction on `client` that reads one snapshot throughout (an export, a
/// comparison of many tables): nothing committed after it began is seen by any statement.
pub(crate) async fn read_only_snapshot(
    client: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

/// The whole-log page query: `$1..$3` the cursor to read after, `$4` the page size.
pub(crate) fn read_log_sql() -> String {
    format!(
        "SELECT {EVENT_COLUMNS} FROM events \
         WHERE (log_epoch, tx_id, position) > ($1, $2::xid8, $3) AND {HORIZON} \
         ORDER BY events.log_epoch, events.tx_id, events.position LIMIT $4"
    )
}

pub(crate) fn page_limit(limit: usize) -> Result<i64, StoreError> {
    if limit == 0 || limit > READ_PAGE_EVENTS_MAX {
        return Err(
            ValidationError::PageSize { requested: limit, max: READ_PAGE_EVENTS_MAX }.into()
        );
    }
    Ok(i64::try_from(limit).unwrap_or(i64::MAX))
}

/// A count or version for an `int8` column; none comes near `i64::MAX`.
pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn decode_all(rows: &[Row]) -> Result<Vec<RecordedEvent>, StoreError> {
    rows.iter().map(rows::decode).collect()
}

impl PgEventStore {
    /// Appends like [`EventStore::append`] and, in the same transaction, records `ledger` in the
    /// idempotency ledger. [`StoreError::OperationKeyTaken`] when another append recorded the
    /// key first (nothing is then written).
    pub async fn append_recorded(
        &self,
        appends: Vec<StreamAppend>,
        ledger: LedgerEntry,
    ) -> Result<AppendOutcome, StoreError> {
        if !appends.iter().any(|a| a.stream_id == ledger.stream) {
            return Err(ValidationError::LedgerStreamNotAppended { stream: ledger.stream }.into());
        }
        self.append_with(appends, Some(ledger)).await
    }

    async fn append_with(
        &self,
        appends: Vec<StreamAppend>,
        ledger: Option<LedgerEntry>,
    ) -> Result<AppendOutcome, StoreError> {
        let rendered = render(&appends, self.config.payload_max_bytes)?;
        let events: usize = appends.iter().map(|a| a.events.len()).sum();
        if self.config.committers == 0 || events > GROUP_EVENTS_PER_APPEND_MAX {
            let prepared = Prepared::new(&appends, rendered).with_ledger(ledger.as_ref());
            return self.append_alone(&prepared).await;
        }
        self.append_grouped(appends, rendered, ledger).await
    }
}

impl EventStore for PgEventStore {
    async fn append(&self, appends: Vec<StreamAppend>) -> Result<AppendOutcome, StoreError> {
        self.append_with(appends, None).await
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
        let events = decode_all(&rows)?;
        if let Some(last) = events.last() {
            // A head a later append to this stream can chain from without reading it again.
            self.heads.remember(stream.as_str(), Head { version: last.version, hash: last.hash });
        }
        Ok(events)
    }

    async fn read_log(&self, after: Cursor, limit: usize) -> Result<LogPage, StoreError> {
        let limit = page_limit(limit)?;
        let epoch = i32::try_from(after.log_epoch).unwrap_or(i32::MAX);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&epoch, &Xid8(after.tx_id), &to_i64(after.position), &limit];
        let events = decode_all(&self.query(&read_log_sql(), &params).await?)?;
        let next = events.last().map_or(after, |event| event.cursor);
        Ok(LogPage { events, next })
    }

    async fn head(&self) -> Result<Cursor, StoreError> {
        let sql = format!(
            "SELECT log_epoch, tx_id, position FROM events WHERE {HORIZON} \
             ORDER BY events.log_epoch DESC, events.tx_id DESC, events.position DESC LIMIT 1"
        );
        let rows = self.query(&sql, &[]).await?;
        Ok(rows.first().map_or(Cursor::START, rows::cursor_of))
    }
}
