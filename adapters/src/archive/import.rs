//! Restoring a complete export into an empty database: every event, seal and stream head
//! exactly as exported (ids, positions, transaction ids, versions, hashes), by `COPY`, in one
//! transaction that verifies the file as it reads it and commits nothing unless it verifies.
//! The epoch is then raised past the restored events', so new events sort after them
//! (this cluster's transaction ids may be lower than the exported ones).

use std::io::BufRead;

use deadpool_postgres::Transaction;
use leasehold_domain::Cursor;
use tokio_postgres::types::{Json, ToSql, Type};

use super::check::{FileCheck, FileReport};
use super::copy_rows::{CopyError, CopyRows};
use super::lines::{EventLine, Line, SealLine, StreamLine, View};
use super::{ArchiveError, HeadsAhead};
use crate::store::{PgEventStore, Xid8, from_driver, raise_epoch_in, to_i64};

/// The columns an event is copied into, in this order.
const EVENT_COLUMNS: &str = "position, log_epoch, tx_id, event_id, stream_id, version, \
     stream_type, tenant_id, event_type, schema_version, payload, metadata, recorded_at, \
     prev_hash, hash";

const STREAM_COLUMNS: &str = "stream_id, stream_type, tenant_id, version, last_hash, last_tx_id";

/// Seals held back while events are copied: writing them ends the events' `COPY` (which the
/// server must then finish before anything else), so they are written a few thousand at a
/// time. Each is held without its lists (some 150 bytes).
const SEALS_HELD_MAX: usize = 4_096;

/// The seals held, each with its events' hashes and positions read from the events just
/// copied: those after the seal before it (`after_*`) up to its last. The file was checked to
/// list exactly those in each seal (else nothing is committed), so these are its lists. The
/// `LIMIT` ends each index scan at the seal's last event: a row comparison's upper bound
/// alone does not, and each seal would read on to the end of the log.
const SEALS_SQL: &str = "INSERT INTO ledger_seals (seal_no, first_epoch, first_tx_id, \
       first_position, last_epoch, last_tx_id, last_position, events, hashes, positions, \
       prev_digest, digest, sealed_at) \
     SELECT s.seal_no, s.first_epoch, s.first_tx_id::text::xid8, s.first_position, \
       s.last_epoch, s.last_tx_id::text::xid8, s.last_position, s.events, \
       coalesce(covered.hashes, ''::bytea), coalesce(covered.positions, '{}'), \
       s.prev_digest, s.digest, s.sealed_at \
     FROM unnest($1::int8[], $2::int4[], $3::int8[], $4::int8[], $5::int4[], $6::int8[], \
       $7::int8[], $8::int8[], $9::bytea[], $10::bytea[], $11::timestamptz[], $12::int4[], \
       $13::int8[], $14::int8[]) AS s(seal_no, first_epoch, first_tx_id, first_position, \
       last_epoch, last_tx_id, last_position, events, prev_digest, digest, sealed_at, \
       after_epoch, after_tx_id, after_position) \
     CROSS JOIN LATERAL (SELECT \
         string_agg(c.hash, ''::bytea ORDER BY c.log_epoch, c.tx_id, c.position) AS hashes, \
         array_agg(c.position ORDER BY c.log_epoch, c.tx_id, c.position) AS positions \
       FROM (SELECT e.log_epoch, e.tx_id, e.position, e.hash FROM events e \
         WHERE (e.log_epoch, e.tx_id, e.position) \
             > (s.after_epoch, s.after_tx_id::text::xid8, s.after_position) \
           AND (e.log_epoch, e.tx_id, e.position) \
             <= (s.last_epoch, s.last_tx_id::text::xid8, s.last_position) \
         ORDER BY e.log_epoch, e.tx_id, e.position LIMIT s.events) c) covered";

/// A seal held back: its line less its lists, and where its range starts.
struct HeldSeal {
    line: SealLine,
    /// How many events it covers.
    events: usize,
    /// The last event of the seal before it (the log's start for the first).
    after: Cursor,
}

/// What an import restored.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// The file, checked.
    pub checked: FileReport,
    /// The epoch new events are now appended in.
    pub epoch: u32,
}

/// The target's open `COPY`, if any: one table at a time on one connection.
enum Copying {
    None,
    Events(CopyRows),
    Streams(CopyRows),
}

/// Restores the export `reader` holds into `store`'s database, which must hold no log yet,
/// checking it as it reads (its heads read ahead by `heads`, if given: a second reader of the
/// same file); `progress` is called now and then with the bytes read.
///
/// # Errors
/// [`ArchiveError::NotEmpty`] for a database that holds a log, [`ArchiveError::Unsuitable`]
/// for a file that is not a complete export of every field, [`ArchiveError::DoesNotVerify`]
/// for one that does not verify (nothing is committed), or the database's or file's failure.
pub async fn import(
    store: &PgEventStore,
    mut reader: impl BufRead,
    heads: Option<HeadsAhead<'_>>,
    mut progress: impl FnMut(u64),
) -> Result<ImportSummary, ArchiveError> {
    let endpoint = store.endpoint().to_owned();
    let fail = |error| ArchiveError::Store(from_driver(error, &endpoint));
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(fail)?;
    tx.batch_execute(
        "SET LOCAL idle_in_transaction_session_timeout = 0; SET LOCAL jit = off; \
         LOCK TABLE events, streams, ledger_seals IN EXCLUSIVE MODE",
    )
    .await
    .map_err(fail)?;
    refuse_a_log(&tx, &fail).await?;
    let mut target = Target::new(&tx, &fail).await?;
    let mut check = FileCheck::new(heads);
    let (mut text, mut number, mut bytes) = (String::new(), 0_u64, 0_u64);
    loop {
        text.clear();
        let read = reader.read_line(&mut text)?;
        if read == 0 {
            break;
        }
        (number, bytes) = (number + 1, bytes + read as u64);
        let line = Line::parse(number, text.trim_end_matches(['\n', '\r']))?;
        check.line(number, &line)?;
        target.line(line).await?;
        if number % 10_000 == 0 {
            progress(bytes);
        }
    }
    progress(bytes);
    target.close().await?;
    let checked = check.finish()?;
    if let Some(first) = checked.report.first_break() {
        return Err(ArchiveError::DoesNotVerify { first: first.to_string() });
    }
    let epoch = settle(&tx, target.max_epoch).await.map_err(fail)?;
    tx.commit().await.map_err(fail)?;
    Ok(ImportSummary { checked, epoch })
}

async fn refuse_a_log(
    tx: &Transaction<'_>,
    fail: &impl Fn(tokio_postgres::Error) -> ArchiveError,
) -> Result<(), ArchiveError> {
    let row = tx
        .query_one(
            "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM streams), \
             (SELECT count(*) FROM ledger_seals) + (SELECT count(*) FROM idempotency) \
             + (SELECT count(*) FROM projection_checkpoints)",
            &[],
        )
        .await
        .map_err(fail)?;
    let count = |at: usize| u64::try_from(row.get::<_, i64>(at)).unwrap_or_default();
    if count(0) + count(1) + count(2) > 0 {
        return Err(ArchiveError::NotEmpty { events: count(0), streams: count(1) });
    }
    Ok(())
}

/// Positions go on from the restored ones; the epoch is raised past theirs.
async fn settle(tx: &Transaction<'_>, max_epoch: i32) -> Result<u32, tokio_postgres::Error> {
    tx.execute(
        "SELECT setval(pg_get_serial_sequence('events', 'position'), \
         coalesce((SELECT max(position) FROM events), 1), (SELECT count(*) > 0 FROM events))",
        &[],
    )
    .await?;
    raise_epoch_in(tx, max_epoch).await
}

/// Where the lines go.
struct Target<'a, F> {
    tx: &'a Transaction<'a>,
    fail: &'a F,
    copying: Copying,
    event_types: Vec<Type>,
    stream_types: Vec<Type>,
    seals: Vec<HeldSeal>,
    /// The last event the last seal read covers.
    sealed: Cursor,
    max_epoch: i32,
}

/// The column types of `columns` of `table`, as the server names them (`xid8` has no constant
/// in every driver version).
async fn column_types(
    tx: &Transaction<'_>,
    table: &str,
    columns: &str,
) -> Result<Vec<Type>, tokio_postgres::Error> {
    let statement = tx.prepare(&format!("SELECT {columns} FROM {table} LIMIT 0")).await?;
    Ok(statement.columns().iter().map(|column| column.type_().clone()).collect())
}

impl<'a, F: Fn(tokio_postgres::Error) -> ArchiveError> Target<'a, F> {
    async fn new(tx: &'a Transaction<'a>, fail: &'a F) -> Result<Self, ArchiveError> {
        Ok(Self {
            tx,
            fail,
            copying: Copying::None,
            event_types: column_types(tx, "events", EVENT_COLUMNS).await.map_err(fail)?,
            stream_types: column_types(tx, "streams", STREAM_COLUMNS).await.map_err(fail)?,
            seals: Vec::new(),
            sealed: Cursor::START,
            max_epoch: 0,
        })
    }

    async fn line(&mut self, line: Line) -> Result<(), ArchiveError> {
        match line {
            Line::Header(header) => {
                if header.view != View::Full || !header.complete || !header.filters.is_complete() {
                    return Err(ArchiveError::Unsuitable(
                        "only a complete export (no filter) can be imported".into(),
                    ));
                }
            }
            Line::Event(event) => self.event(&event).await?,
            Line::Seal(mut seal) => {
                let after = std::mem::replace(&mut self.sealed, seal.last);
                let events = seal.positions.len();
                (seal.hashes, seal.positions) = (Vec::new(), Vec::new());
                self.seals.push(HeldSeal { line: *seal, events, after });
                if self.seals.len() >= SEALS_HELD_MAX {
                    self.close().await?;
                }
            }
            Line::Stream(stream) => self.stream(&stream).await?,
            Line::End(_) => self.close().await?,
        }
        Ok(())
    }

    async fn event(&mut self, event: &EventLine) -> Result<(), ArchiveError> {
        if !matches!(self.copying, Copying::Events(_)) {
            self.close().await?;
            let sql = format!("COPY events ({EVENT_COLUMNS}) FROM STDIN (FORMAT binary)");
            let sink = self.tx.copy_in(&sql).await.map_err(self.fail)?;
            self.copying = Copying::Events(CopyRows::new(sink, &self.event_types));
        }
        let epoch = i32::try_from(event.cursor.log_epoch).unwrap_or(i32::MAX);
        self.max_epoch = self.max_epoch.max(epoch);
        let Copying::Events(writer) = &mut self.copying else { return Ok(()) };
        let schema_version = i32::try_from(event.schema_version).unwrap_or(i32::MAX);
        let (payload, metadata) = (Json(&event.payload), Json(&event.metadata));
        let row: [&(dyn ToSql + Sync); 15] = [
            &to_i64(event.position),
            &epoch,
            &Xid8(event.cursor.tx_id),
            &event.event_id,
            &event.stream_id,
            &to_i64(event.version),
            &event.stream_type,
            &event.tenant_id,
            &event.event_type,
            &schema_version,
            &payload,
            &metadata,
            &event.recorded_at,
            &&event.prev_hash.0[..],
            &&event.hash.0[..],
        ];
        writer.write(&row).await.map_err(|error| self.copy_failed(error))
    }

    fn copy_failed(&self, error: CopyError) -> ArchiveError {
        match error {
            CopyError::Driver(error) => (self.fail)(error),
            CopyError::Value(reason) => {
                ArchiveError::Store(leasehold_domain::StoreError::Database {
                    reason: format!("a value cannot be copied: {reason}"),
                })
            }
        }
    }

    async fn stream(&mut self, stream: &StreamLine) -> Result<(), ArchiveError> {
        if !matches!(self.copying, Copying::Streams(_)) {
            self.close().await?;
            let sql = format!("COPY streams ({STREAM_COLUMNS}) FROM STDIN (FORMAT binary)");
            let sink = self.tx.copy_in(&sql).await.map_err(self.fail)?;
            self.copying = Copying::Streams(CopyRows::new(sink, &self.stream_types));
        }
        let Copying::Streams(writer) = &mut self.copying else { return Ok(()) };
        let row: [&(dyn ToSql + Sync); 6] = [
            &stream.stream_id,
            &stream.stream_type,
            &stream.tenant_id,
            &to_i64(stream.version),
            &&stream.last_hash.0[..],
            &Xid8(stream.last_tx_id),
        ];
        writer.write(&row).await.map_err(|error| self.copy_failed(error))
    }

    /// Ends the open `COPY`, then writes the seals held back.
    async fn close(&mut self) -> Result<(), ArchiveError> {
        match std::mem::replace(&mut self.copying, Copying::None) {
            Copying::None => {}
            Copying::Events(writer) | Copying::Streams(writer) => {
                writer.finish().await.map_err(|error| self.copy_failed(error))?;
            }
        }
        self.write_seals().await
    }

    /// Writes the seals held back, in one statement.
    async fn write_seals(&mut self) -> Result<(), ArchiveError> {
        let seals = std::mem::take(&mut self.seals);
        if seals.is_empty() {
            return Ok(());
        }
        let column = |f: &dyn Fn(&HeldSeal) -> i64| seals.iter().map(f).collect::<Vec<i64>>();
        let epochs = |f: &dyn Fn(&HeldSeal) -> u32| {
            seals.iter().map(|s| i32::try_from(f(s)).unwrap_or(i32::MAX)).collect::<Vec<i32>>()
        };
        let digests = |f: &dyn Fn(&HeldSeal) -> &[u8]| seals.iter().map(f).collect::<Vec<_>>();
        let sealed_at: Vec<_> = seals.iter().map(|s| s.line.sealed_at).collect();
        let tx = |c: Cursor| i64::try_from(c.tx_id).unwrap_or(i64::MAX);
        let statement = self.tx.prepare_cached(SEALS_SQL).await.map_err(self.fail)?;
        let written = self
            .tx
            .execute(
                &statement,
                &[
                    &column(&|s| to_i64(s.line.seal_no)),
                    &epochs(&|s| s.line.first.log_epoch),
                    &column(&|s| tx(s.line.first)),
                    &column(&|s| to_i64(s.line.first.position)),
                    &epochs(&|s| s.line.last.log_epoch),
                    &column(&|s| tx(s.line.last)),
                    &column(&|s| to_i64(s.line.last.position)),
                    &column(&|s| i64::try_from(s.events).unwrap_or(i64::MAX)),
                    &digests(&|s| &s.line.prev_digest.0[..]),
                    &digests(&|s| &s.line.digest.0[..]),
                    &sealed_at,
                    &epochs(&|s| s.after.log_epoch),
                    &column(&|s| tx(s.after)),
                    &column(&|s| to_i64(s.after.position)),
                ],
            )
            .await
            .map_err(self.fail)?;
        debug_assert_eq!(written, seals.len() as u64);
        Ok(())
    }
}
