//! Restoring a complete export into an empty database: every event, seal and stream head
//! exactly as exported (ids, positions, transaction ids, versions, hashes), by `COPY`, in one
//! transaction that verifies the file as it reads it and commits nothing unless it verifies.
//! The epoch is then raised past the restored events', so new events sort after them
//! (this cluster's transaction ids may be lower than the exported ones).

use std::io::BufRead;

use deadpool_postgres::Transaction;
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

const SEAL_COLUMNS: &str = "seal_no, first_epoch, first_tx_id, first_position, last_epoch, \
     last_tx_id, last_position, events, hashes, positions, prev_digest, digest, sealed_at";

/// Seals held back while events are copied (each ends the events' `COPY` to be written).
const SEALS_HELD_MAX: usize = 16;

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
        "SET LOCAL idle_in_transaction_session_timeout = 0; \
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
    seals: Vec<SealLine>,
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
            Line::Seal(seal) => {
                self.seals.push(*seal);
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
        for seal in std::mem::take(&mut self.seals) {
            self.write_seal(&seal).await?;
        }
        Ok(())
    }

    async fn write_seal(&self, seal: &SealLine) -> Result<(), ArchiveError> {
        let cursor = |c: leasehold_domain::Cursor| {
            (i32::try_from(c.log_epoch).unwrap_or(i32::MAX), Xid8(c.tx_id), to_i64(c.position))
        };
        let (first, last) = (cursor(seal.first), cursor(seal.last));
        let events = i64::try_from(seal.positions.len()).unwrap_or(i64::MAX);
        let sql = format!(
            "INSERT INTO ledger_seals ({SEAL_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        );
        self.tx
            .execute(
                &sql,
                &[
                    &to_i64(seal.seal_no),
                    &first.0,
                    &first.1,
                    &first.2,
                    &last.0,
                    &last.1,
                    &last.2,
                    &events,
                    &seal.hashes,
                    &seal.positions,
                    &&seal.prev_digest.0[..],
                    &&seal.digest.0[..],
                    &seal.sealed_at,
                ],
            )
            .await
            .map_err(self.fail)?;
        Ok(())
    }
}
