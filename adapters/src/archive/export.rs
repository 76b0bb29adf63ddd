//! Writing the log to a file: one read-only snapshot (repeatable read), read in bounded pages
//! in commit order below the horizon it had when it began, each page written before the next
//! is read, so memory stays flat however long the log.

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;
use leasehold_domain::{Cursor, RecordedEvent, StoreError};
use serde::{Deserialize, Serialize};
use tokio_postgres::Row;
use tokio_postgres::types::Json;

use super::ArchiveError;
use super::lines::{
    EndLine, EventHead, EventLine, FORMAT, FORMAT_VERSION, Hash32, HeaderLine, SealLine,
    StreamLine, TenantEventLine, View, optional_cursor, write_event_text, write_line,
};
use crate::store::{PgEventStore, Xid8, cursor_of, from_driver, to_i64};

/// Events read per page.
const PAGE_EVENTS: i64 = 5_000;

/// Stream heads read per page.
const PAGE_STREAMS: i32 = 5_000;

/// Which events an export holds. No filter at all makes a complete export (every seal and
/// every stream's head too: importable). A tenant filter gives that tenant's view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportFilter {
    /// Only this tenant's streams, as its tenant views show them (no operator-only field, no
    /// id, metadata, hash or cursor).
    pub tenant: Option<String>,
    /// Only streams of these types (empty: every type).
    pub stream_types: Vec<String>,
    /// Only these streams (empty: every stream).
    pub stream_ids: Vec<String>,
    /// Only events after this cursor.
    #[serde(with = "optional_cursor")]
    pub from_cursor: Option<Cursor>,
    /// Only events up to and including this cursor.
    #[serde(with = "optional_cursor")]
    pub to_cursor: Option<Cursor>,
    /// Only events recorded at or after this time.
    pub from_time: Option<DateTime<Utc>>,
    /// Only events recorded before this time.
    pub to_time: Option<DateTime<Utc>>,
}

impl ExportFilter {
    /// No filter: the whole log.
    pub fn is_complete(&self) -> bool {
        *self == Self::default()
    }

    /// Whole streams from their first event: no cut at the start, by cursor or by time.
    pub fn from_the_start(&self) -> bool {
        self.from_cursor.is_none() && self.from_time.is_none()
    }

    /// Seals can be checked against what the file holds: every event of their ranges is in
    /// it (only a cursor range narrows the log; a seal cut by it is left out).
    pub fn keeps_seals(&self) -> bool {
        self.tenant.is_none()
            && self.stream_types.is_empty()
            && self.stream_ids.is_empty()
            && self.from_time.is_none()
            && self.to_time.is_none()
    }

    fn view(&self) -> View {
        if self.tenant.is_some() { View::Tenant } else { View::Full }
    }

    /// Whether `event` passes every filter (as the export's query does).
    pub fn admits(&self, event: &RecordedEvent) -> bool {
        let listed =
            |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v == value);
        self.tenant.as_deref().is_none_or(|tenant| event.tenant_id.as_str() == tenant)
            && listed(&self.stream_types, event.stream_type.as_str())
            && listed(&self.stream_ids, event.stream_id.as_str())
            && self.from_cursor.is_none_or(|from| event.cursor > from)
            && self.to_cursor.is_none_or(|to| event.cursor <= to)
            && self.from_time.is_none_or(|from| event.recorded_at >= from)
            && self.to_time.is_none_or(|to| event.recorded_at < to)
    }

    /// Writes `line` as this filter's view shows it: every field, or its tenant's view.
    ///
    /// # Errors
    /// When `out` fails.
    pub fn write_event(
        &self,
        out: &mut impl std::io::Write,
        line: EventLine,
    ) -> std::io::Result<()> {
        if self.tenant.is_some() {
            write_line(out, "event", &TenantEventLine::of(line))
        } else {
            write_line(out, "event", &line)
        }
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportSummary {
    /// Events written.
    pub events: u64,
    /// Seals written.
    pub seals: u64,
    /// Stream heads written.
    pub streams: u64,
    /// The last event's cursor (resume a later export or a tail after it).
    pub last: Option<Cursor>,
}

/// The events a filter admits, below the horizon `($1, $2)`, after `($3, $4, $5)`.
const EVENTS_SQL: &str = "SELECT log_epoch, tx_id, position, event_id, stream_id, stream_type, \
     tenant_id, version, event_type, schema_version, payload, metadata, recorded_at, prev_hash, \
     hash FROM events WHERE (log_epoch, tx_id) < ($1, $2::xid8) \
     AND (log_epoch, tx_id, position) > ($3, $4::xid8, $5) AND FILTERS \
     ORDER BY log_epoch, tx_id, position LIMIT $13";

/// How many events a filter admits below the horizon (the header's count).
const COUNT_SQL: &str = "SELECT count(*) FROM events WHERE (log_epoch, tx_id) < ($1, $2::xid8) \
     AND (log_epoch, tx_id, position) > ($3, $4::xid8, $5) AND FILTERS AND $13::int8 >= 0";

/// The filters, `$6` to `$12`.
const FILTERS: &str = "($6::int4 IS NULL OR (log_epoch, tx_id, position) <= ($6, $7::xid8, $8)) \
     AND ($9::text IS NULL OR tenant_id = $9) \
     AND (cardinality($10::text[]) = 0 OR stream_type = ANY($10)) \
     AND (cardinality($11::text[]) = 0 OR stream_id = ANY($11)) \
     AND ($12::timestamptz IS NULL OR recorded_at >= $12) \
     AND ($14::timestamptz IS NULL OR recorded_at < $14)";

/// Seals wholly inside the cursor range, after seal `$1`.
const SEALS_SQL: &str = "SELECT seal_no, first_epoch, first_tx_id, first_position, last_epoch, \
     last_tx_id, last_position, positions, hashes, prev_digest, digest, sealed_at \
     FROM ledger_seals WHERE seal_no > $1 \
     AND (first_epoch, first_tx_id, first_position) > ($2, $3::xid8, $4) \
     AND ($5::int4 IS NULL OR (last_epoch, last_tx_id, last_position) <= ($5, $6::xid8, $7)) \
     ORDER BY seal_no LIMIT 1";

const SEAL_COUNT_SQL: &str = "SELECT count(*) FROM ledger_seals \
     WHERE (first_epoch, first_tx_id, first_position) > ($2, $3::xid8, $4) \
     AND ($5::int4 IS NULL OR (last_epoch, last_tx_id, last_position) <= ($5, $6::xid8, $7)) \
     AND $1::int8 >= 0";

/// Every stream's head, in the commit order of the event it names, so that a checker reading
/// the heads alongside the events can forget each stream as soon as its last event is checked
/// ([`crate::archive::check::HeadsAhead`]). A head written by a transaction at or above the
/// horizon (`$1`, in the current epoch `$2`) is beyond the events exported: its stream's last
/// exported event is its head instead. A head whose event is not in the log sorts last.
const STREAMS_SQL: &str = "WITH heads AS (SELECT s.stream_id, s.stream_type, s.tenant_id, \
       CASE WHEN s.last_tx_id < $1::xid8 THEN s.version ELSE e.version END AS version, \
       CASE WHEN s.last_tx_id < $1::xid8 THEN s.last_hash ELSE e.hash END AS last_hash, \
       CASE WHEN s.last_tx_id < $1::xid8 THEN s.last_tx_id ELSE e.tx_id END AS last_tx_id \
     FROM streams s LEFT JOIN LATERAL (SELECT version, hash, tx_id FROM events \
       WHERE s.last_tx_id >= $1::xid8 AND stream_id = s.stream_id \
       AND (log_epoch, tx_id) < ($2, $1::xid8) ORDER BY version DESC LIMIT 1) e ON true) \
     SELECT h.stream_id, h.stream_type, h.tenant_id, h.version, h.last_hash, h.last_tx_id \
     FROM heads h LEFT JOIN events last \
       ON last.stream_id = h.stream_id AND last.version = h.version \
     ORDER BY last.log_epoch, last.tx_id, last.position, h.stream_id";

/// Where the export's snapshot stands: the current epoch and the horizon.
#[derive(Debug, Clone, Copy)]
struct Horizon {
    epoch: i32,
    xmin: Xid8,
}

impl PgEventStore {
    /// Writes the log's events that `filter` admits to `out`, as the format says
    /// ([`crate::archive`]), from one snapshot; `progress` is called after each page with the
    /// events written so far.
    ///
    /// # Errors
    /// [`ArchiveError`] when the database or `out` fails.
    pub async fn export(
        &self,
        filter: &ExportFilter,
        out: &mut impl std::io::Write,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<ExportSummary, ArchiveError> {
        let endpoint = self.endpoint().to_owned();
        let fail = |error| ArchiveError::Store(from_driver(error, &endpoint));
        let mut client = self.client().await?;
        let tx = crate::store::read_only_snapshot(&mut client).await.map_err(fail)?;
        // Writing to a slow reader leaves the transaction idle between pages; it holds no
        // transaction id, so it holds no reader back.
        tx.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            .await
            .map_err(fail)?;
        let row = tx
            .query_one(
                "SELECT current_epoch, pg_snapshot_xmin(pg_current_snapshot()) FROM log_meta",
                &[],
            )
            .await
            .map_err(fail)?;
        let horizon = Horizon { epoch: row.get(0), xmin: row.get(1) };
        let mut export = Export::new(&tx, filter, horizon, fail);
        let header = export.header().await?;
        progress(0, header.events);
        write_line(out, "header", &header)?;
        let mut summary = ExportSummary { events: 0, seals: 0, streams: 0, last: None };
        export.events(out, &mut summary, |written| progress(written, header.events)).await?;
        if filter.is_complete() {
            summary.streams = export.streams(out).await?;
        }
        let end =
            EndLine { events: summary.events, seals: summary.seals, streams: summary.streams };
        write_line(out, "end", &end)?;
        out.flush()?;
        tx.commit().await.map_err(fail)?;
        Ok(summary)
    }
}

/// One export in progress.
struct Export<'a, F> {
    tx: &'a Transaction<'a>,
    filter: &'a ExportFilter,
    horizon: Horizon,
    fail: F,
    next_seal: Option<SealLine>,
}

/// A cursor as three parameters (epoch, transaction id, position).
fn cursor_params(cursor: Cursor) -> (i32, Xid8, i64) {
    (
        i32::try_from(cursor.log_epoch).unwrap_or(i32::MAX),
        Xid8(cursor.tx_id),
        to_i64(cursor.position),
    )
}

fn optional_params(cursor: Option<Cursor>) -> (Option<i32>, Option<Xid8>, Option<i64>) {
    match cursor.map(cursor_params) {
        Some((epoch, tx, position)) => (Some(epoch), Some(tx), Some(position)),
        None => (None, None, None),
    }
}

impl<'a, F: Fn(tokio_postgres::Error) -> ArchiveError> Export<'a, F> {
    fn new(tx: &'a Transaction<'a>, filter: &'a ExportFilter, horizon: Horizon, fail: F) -> Self {
        Self { tx, filter, horizon, fail, next_seal: None }
    }

    async fn header(&self) -> Result<HeaderLine, ArchiveError> {
        let count = COUNT_SQL.replace("FILTERS", FILTERS);
        let from = self.filter.from_cursor.unwrap_or(Cursor::START);
        let events = self.query_events(&count, from, None).await?;
        let events = u64::try_from(events[0].get::<_, i64>(0)).unwrap_or_default();
        let seals = if self.keeps_seals() { self.count_seals().await? } else { 0 };
        Ok(HeaderLine {
            format: FORMAT.to_owned(),
            format_version: FORMAT_VERSION,
            exported_at: Utc::now(),
            view: self.filter.view(),
            complete: self.filter.is_complete(),
            filters: self.filter.clone(),
            events,
            seals,
        })
    }

    fn keeps_seals(&self) -> bool {
        self.filter.keeps_seals()
    }

    /// Runs an events query (`sql`, with `FILTERS` put in) after `after`.
    async fn query_events(
        &self,
        sql: &str,
        after: Cursor,
        limit: Option<i64>,
    ) -> Result<Vec<Row>, ArchiveError> {
        let (epoch, tx_id, position) = cursor_params(after);
        let (to_epoch, to_tx, to_position) = optional_params(self.filter.to_cursor);
        let filter = self.filter;
        let limit = limit.unwrap_or(0);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 14] = [
            &self.horizon.epoch,
            &self.horizon.xmin,
            &epoch,
            &tx_id,
            &position,
            &to_epoch,
            &to_tx,
            &to_position,
            &filter.tenant,
            &filter.stream_types,
            &filter.stream_ids,
            &filter.from_time,
            &limit,
            &filter.to_time,
        ];
        let statement = self.tx.prepare_cached(sql).await.map_err(&self.fail)?;
        self.tx.query(&statement, &params).await.map_err(&self.fail)
    }

    async fn count_seals(&self) -> Result<u64, ArchiveError> {
        let rows = self.query_seals(SEAL_COUNT_SQL, 0).await?;
        Ok(u64::try_from(rows[0].get::<_, i64>(0)).unwrap_or_default())
    }

    async fn query_seals(&self, sql: &str, after_seal: i64) -> Result<Vec<Row>, ArchiveError> {
        let (epoch, tx_id, position) =
            cursor_params(self.filter.from_cursor.unwrap_or(Cursor::START));
        let (to_epoch, to_tx, to_position) = optional_params(self.filter.to_cursor);
        self.tx
            .query(sql, &[&after_seal, &epoch, &tx_id, &position, &to_epoch, &to_tx, &to_position])
            .await
            .map_err(&self.fail)
    }

    /// The next seal to write after seal `after`, if one is left.
    async fn fetch_seal(&mut self, after: u64) -> Result<(), ArchiveError> {
        self.next_seal = None;
        if !self.keeps_seals() {
            return Ok(());
        }
        let rows = self.query_seals(SEALS_SQL, to_i64(after)).await?;
        self.next_seal = rows.first().map(seal_line).transpose()?;
        Ok(())
    }

    /// Writes every event page by page, each seal after the last event it covers.
    async fn events(
        &mut self,
        out: &mut impl std::io::Write,
        summary: &mut ExportSummary,
        mut progress: impl FnMut(u64),
    ) -> Result<(), ArchiveError> {
        let sql = EVENTS_SQL.replace("FILTERS", FILTERS);
        let mut after = self.filter.from_cursor.unwrap_or(Cursor::START);
        self.fetch_seal(0).await?;
        let mut buffer = Vec::with_capacity(1024);
        loop {
            let rows = self.query_events(&sql, after, Some(PAGE_EVENTS)).await?;
            for row in &rows {
                let cursor = cursor_of(row);
                self.write_seals(|last| last < cursor, out, summary).await?;
                self.write_event(row, out, &mut buffer)?;
                summary.events += 1;
                summary.last = Some(cursor);
                after = cursor;
                self.write_seals(|last| last <= cursor, out, summary).await?;
            }
            progress(summary.events);
            if rows.len() < usize::try_from(PAGE_EVENTS).unwrap_or(usize::MAX) {
                break;
            }
        }
        // A seal over events this snapshot does not hold (the log was altered) still goes.
        self.write_seals(|_| true, out, summary).await
    }

    /// Writes every pending seal whose last event's cursor `due` says is written by now.
    async fn write_seals(
        &mut self,
        due: impl Fn(Cursor) -> bool,
        out: &mut impl std::io::Write,
        summary: &mut ExportSummary,
    ) -> Result<(), ArchiveError> {
        while let Some(seal) = self.next_seal.take_if(|seal| due(seal.last)) {
            write_line(out, "seal", &seal)?;
            summary.seals += 1;
            self.fetch_seal(seal.seal_no).await?;
        }
        Ok(())
    }

    fn write_event(
        &self,
        row: &Row,
        out: &mut impl std::io::Write,
        buffer: &mut Vec<u8>,
    ) -> Result<(), ArchiveError> {
        if self.filter.tenant.is_some() {
            // A tenant's view keeps some of the payload's fields: it is read as a value.
            return Ok(self.filter.write_event(out, event_line(row)?)?);
        }
        let (JsonText(payload), JsonText(metadata)) = (row.get(10), row.get(11));
        Ok(write_event_text(out, buffer, &event_head(row)?, payload, metadata)?)
    }

    /// Writes every stream's head, page by page from one portal; returns how many.
    async fn streams(&self, out: &mut impl std::io::Write) -> Result<u64, ArchiveError> {
        let statement = self.tx.prepare_cached(STREAMS_SQL).await.map_err(&self.fail)?;
        let portal = self
            .tx
            .bind(&statement, &[&self.horizon.xmin, &self.horizon.epoch])
            .await
            .map_err(&self.fail)?;
        let mut written = 0;
        loop {
            let rows = self.tx.query_portal(&portal, PAGE_STREAMS).await.map_err(&self.fail)?;
            for row in &rows {
                let line = stream_line(row)?;
                // A stream whose every event is beyond the horizon is not in this export.
                if line.version > 0 {
                    write_line(out, "stream", &line)?;
                    written += 1;
                }
            }
            if rows.len() < usize::try_from(PAGE_STREAMS).unwrap_or(usize::MAX) {
                return Ok(written);
            }
        }
    }
}

fn corrupt(position: u64, reason: &str) -> ArchiveError {
    ArchiveError::Store(StoreError::Corrupt { position, reason: reason.to_owned() })
}

/// A `jsonb` (or `json`) column's text as PostgreSQL stores it, unparsed: an export passes
/// it through.
struct JsonText<'a>(&'a str);

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText<'a> {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = if *ty == tokio_postgres::types::Type::JSONB {
            // The binary `jsonb`: a version byte (1), then the text.
            match raw.split_first() {
                Some((1, text)) => text,
                _ => return Err("a jsonb of an unknown version".into()),
            }
        } else {
            raw
        };
        Ok(Self(std::str::from_utf8(text)?))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(*ty, tokio_postgres::types::Type::JSONB | tokio_postgres::types::Type::JSON)
    }
}

fn hash32(bytes: &[u8], position: u64, column: &str) -> Result<Hash32, ArchiveError> {
    let bytes: [u8; 32] =
        bytes.try_into().map_err(|_| corrupt(position, &format!("{column} is not 32 bytes")))?;
    Ok(Hash32(bytes))
}

/// Every field of a row of [`EVENTS_SQL`] but its JSON ones.
fn event_head(row: &Row) -> Result<EventHead<'_>, ArchiveError> {
    let cursor = cursor_of(row);
    let position = cursor.position;
    Ok(EventHead {
        position,
        cursor,
        event_id: row.get(3),
        stream_id: row.get(4),
        stream_type: row.get(5),
        tenant_id: row.get(6),
        version: u64::try_from(row.get::<_, i64>(7)).unwrap_or_default(),
        event_type: row.get(8),
        schema_version: u32::try_from(row.get::<_, i32>(9)).unwrap_or_default(),
        recorded_at: row.get(12),
        prev_hash: hash32(row.get(13), position, "prev_hash")?,
        hash: hash32(row.get(14), position, "hash")?,
    })
}

fn event_line(row: &Row) -> Result<EventLine, ArchiveError> {
    let (Json(payload), Json(metadata)) = (row.get(10), row.get(11));
    Ok(event_head(row)?.with_json(payload, metadata))
}

fn seal_line(row: &Row) -> Result<SealLine, ArchiveError> {
    let cursor = |at: usize| Cursor {
        log_epoch: u32::try_from(row.get::<_, i32>(at)).unwrap_or_default(),
        tx_id: row.get::<_, Xid8>(at + 1).0,
        position: u64::try_from(row.get::<_, i64>(at + 2)).unwrap_or_default(),
    };
    let last = cursor(4);
    Ok(SealLine {
        seal_no: u64::try_from(row.get::<_, i64>(0)).unwrap_or_default(),
        first: cursor(1),
        last,
        positions: row.get(7),
        hashes: row.get(8),
        prev_digest: hash32(row.get(9), last.position, "a seal's prev_digest")?,
        digest: hash32(row.get(10), last.position, "a seal's digest")?,
        sealed_at: row.get(11),
    })
}

fn stream_line(row: &Row) -> Result<StreamLine, ArchiveError> {
    let version = row.get::<_, Option<i64>>(3).unwrap_or(0);
    let hash = row.get::<_, Option<&[u8]>>(4).unwrap_or(&[0; 32]);
    Ok(StreamLine {
        stream_id: row.get(0),
        stream_type: row.get(1),
        tenant_id: row.get(2),
        version: u64::try_from(version).unwrap_or_default(),
        last_hash: hash32(hash, 0, "a stream's last_hash")?,
        last_tx_id: row.get::<_, Option<Xid8>>(5).map_or(0, |tx| tx.0),
    })
}
