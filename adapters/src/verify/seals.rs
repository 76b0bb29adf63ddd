//! Verifying the seals (schema/postgres/0006_seals.sql): each seal chains from the one
//! before and its digest is the hash of what it lists; the log still holds, in each sealed
//! range and in log order, exactly the events the seal lists. The first place a range
//! differs from its seal is reported with what happened there: an event missing, another
//! event standing where a sealed one stood (altered and re-hashed, or moved there from another
//! range), events reordered within the range, or an event inserted into it. After the
//! last seal, the unsealed tail is checked for each stream's order (version order must be log
//! order).

use std::collections::HashSet;

use leasehold_domain::{Cursor, StoreError};

use super::{BreakKind, ChainBreak, VerifyReport, push_break};
use crate::chain::{GENESIS_HASH, seal_digest};
use crate::store::{PgEventStore, Xid8, from_driver, to_i64};

/// Seals read per query.
const SEALS_PER_PAGE: i64 = 64;

/// One stored seal.
pub(crate) struct StoredSeal {
    pub(crate) seal_no: u64,
    pub(crate) last: Cursor,
    pub(crate) hashes: Vec<u8>,
    pub(crate) positions: Vec<i64>,
    pub(crate) prev_digest: Vec<u8>,
    pub(crate) digest: Vec<u8>,
}

/// One event of a sealed range as the log (or an export file) holds it now.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) position: i64,
    pub(crate) hash: Vec<u8>,
    pub(crate) stream_id: String,
    pub(crate) version: u64,
    /// Its line in an export file (0 in the database).
    pub(crate) line: u64,
}

const SEALS_SQL: &str = "SELECT seal_no, last_epoch, last_tx_id, last_position, hashes, \
     positions, prev_digest, digest FROM ledger_seals WHERE seal_no > $1 ORDER BY seal_no LIMIT $2";

const RANGE_SQL: &str = "SELECT position, hash, stream_id, version FROM events \
     WHERE (log_epoch, tx_id, position) > ($1, $2::xid8, $3) \
     AND (log_epoch, tx_id, position) <= ($4, $5::xid8, $6) \
     ORDER BY log_epoch, tx_id, position";

/// Events after the last seal that come, in log order, after a later version of their stream
/// (a gap is the chain walk's to report).
const TAIL_ORDER_SQL: &str = "SELECT stream_id, version, position FROM (SELECT stream_id, \
     version, position, lag(version) OVER (PARTITION BY stream_id \
     ORDER BY log_epoch, tx_id, position) AS before FROM events \
     WHERE (log_epoch, tx_id, position) > ($1, $2::xid8, $3)) tail \
     WHERE before >= version ORDER BY position";

impl PgEventStore {
    /// Checks every seal against the log, then the unsealed tail's per-stream order. Adds
    /// what it finds to `report`.
    pub(super) async fn verify_seals(&self, report: &mut VerifyReport) -> Result<(), StoreError> {
        let client = self.client().await?;
        let endpoint = self.endpoint();
        let (mut prev_digest, mut after, mut seal_no) = (GENESIS_HASH.to_vec(), Cursor::START, 0);
        loop {
            let rows = client
                .query(SEALS_SQL, &[&to_i64(seal_no), &SEALS_PER_PAGE])
                .await
                .map_err(|e| from_driver(e, endpoint))?;
            for row in &rows {
                let seal = stored_seal(row);
                if seal.seal_no != seal_no + 1
                    || seal.prev_digest != prev_digest
                    || !digest_holds(&seal)
                {
                    let position = seal.positions.first().copied().unwrap_or_default();
                    let kind = BreakKind::SealMismatch { seal_no: seal.seal_no };
                    push_break(report, unknown_stream(position, kind));
                }
                let held = range(&client, endpoint, after, seal.last).await?;
                compare(&seal, &held, report);
                report.seals_checked += 1;
                (prev_digest, after, seal_no) = (seal.digest.clone(), seal.last, seal.seal_no);
            }
            if rows.len() < usize::try_from(SEALS_PER_PAGE).unwrap_or(usize::MAX) {
                break;
            }
        }
        let (epoch, tx, position) = cursor_params(after);
        let tail = client
            .query(TAIL_ORDER_SQL, &[&epoch, &tx, &position])
            .await
            .map_err(|e| from_driver(e, endpoint))?;
        for row in &tail {
            let found = ChainBreak {
                stream_id: row.get(0),
                version: u64::try_from(row.get::<_, i64>(1)).unwrap_or_default(),
                position: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
                line: 0,
                kind: BreakKind::Reordered,
            };
            push_break(report, found);
        }
        let unsealed = client
            .query_one(
                "SELECT count(*) FROM events WHERE (log_epoch, tx_id, position) > ($1, $2::xid8, $3)",
                &[&epoch, &tx, &position],
            )
            .await
            .map_err(|e| from_driver(e, endpoint))?;
        report.unsealed_events = u64::try_from(unsealed.get::<_, i64>(0)).unwrap_or_default();
        Ok(())
    }
}

fn cursor_params(cursor: Cursor) -> (i32, Xid8, i64) {
    (
        i32::try_from(cursor.log_epoch).unwrap_or(i32::MAX),
        Xid8(cursor.tx_id),
        to_i64(cursor.position),
    )
}

fn stored_seal(row: &tokio_postgres::Row) -> StoredSeal {
    StoredSeal {
        seal_no: u64::try_from(row.get::<_, i64>(0)).unwrap_or_default(),
        last: Cursor {
            log_epoch: u32::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
            tx_id: row.get::<_, Xid8>(2).0,
            position: u64::try_from(row.get::<_, i64>(3)).unwrap_or_default(),
        },
        hashes: row.get(4),
        positions: row.get(5),
        prev_digest: row.get(6),
        digest: row.get(7),
    }
}

/// Whether the seal's digest is the hash of its predecessor's digest and its hashes.
pub(crate) fn digest_holds(seal: &StoredSeal) -> bool {
    let Ok(prev) = <[u8; 32]>::try_from(seal.prev_digest.as_slice()) else { return false };
    seal.hashes.len() == 32 * seal.positions.len()
        && seal_digest(&prev, &seal.hashes) == seal.digest.as_slice()
}

async fn range(
    client: &deadpool_postgres::Object,
    endpoint: &str,
    after: Cursor,
    last: Cursor,
) -> Result<Vec<Held>, StoreError> {
    let (epoch, tx, position) = cursor_params(after);
    let (last_epoch, last_tx, last_position) = cursor_params(last);
    let rows = client
        .query(RANGE_SQL, &[&epoch, &tx, &position, &last_epoch, &last_tx, &last_position])
        .await
        .map_err(|e| from_driver(e, endpoint))?;
    Ok(rows
        .iter()
        .map(|row| Held {
            position: row.get(0),
            hash: row.get(1),
            stream_id: row.get(2),
            version: u64::try_from(row.get::<_, i64>(3)).unwrap_or_default(),
            line: 0,
        })
        .collect())
}

/// Reports the first place where the log's range differs from what the seal lists.
pub(crate) fn compare(seal: &StoredSeal, held: &[Held], report: &mut VerifyReport) {
    let sealed: Vec<(i64, &[u8])> =
        seal.positions.iter().copied().zip(seal.hashes.chunks_exact(32)).collect();
    let same = |i: usize| match (sealed.get(i), held.get(i)) {
        (Some((position, hash)), Some(event)) => {
            *position == event.position && *hash == event.hash.as_slice()
        }
        (None, None) => true,
        _ => false,
    };
    let Some(index) = (0..sealed.len().max(held.len())).find(|&i| !same(i)) else {
        return;
    };
    let sealed_hashes: HashSet<&[u8]> = sealed.iter().map(|(_, hash)| *hash).collect();
    let held_hashes: HashSet<&[u8]> = held.iter().map(|event| event.hash.as_slice()).collect();
    let found = match (sealed.get(index), held.get(index)) {
        // Both are in the range, each where the other should be.
        (Some((_, hash)), Some(event))
            if held_hashes.contains(hash) && sealed_hashes.contains(event.hash.as_slice()) =>
        {
            held_break(event, BreakKind::Reordered)
        }
        (Some((position, _)), Some(event))
            if *position == event.position && !sealed_hashes.contains(event.hash.as_slice()) =>
        {
            held_break(event, BreakKind::SealedEventReplaced)
        }
        (_, Some(event)) if !sealed_hashes.contains(event.hash.as_slice()) => {
            held_break(event, BreakKind::InsertedIntoSealedRange)
        }
        (Some((position, _)), _) => unknown_stream(*position, BreakKind::SealedEventMissing),
        // One more event than the seal lists, a copy of one it does list.
        (None, Some(event)) => held_break(event, BreakKind::InsertedIntoSealedRange),
        (None, None) => return,
    };
    push_break(report, found);
}

fn held_break(event: &Held, kind: BreakKind) -> ChainBreak {
    ChainBreak {
        stream_id: event.stream_id.clone(),
        version: event.version,
        position: u64::try_from(event.position).unwrap_or_default(),
        line: event.line,
        kind,
    }
}

/// A break at a position whose event the log no longer holds: its stream is not known (a seal
/// keeps only positions and hashes).
fn unknown_stream(position: i64, kind: BreakKind) -> ChainBreak {
    ChainBreak {
        stream_id: String::new(),
        version: 0,
        position: u64::try_from(position).unwrap_or_default(),
        line: 0,
        kind,
    }
}
