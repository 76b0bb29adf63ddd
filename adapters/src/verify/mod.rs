//! Verifying the hash chains: every stream's versions are contiguous from 1, every event's
//! `prev_hash` is its predecessor's `hash`, every `hash` equals
//! `sha256(prev_hash || canonical JSON)` recomputed from the stored fields, and every stream's
//! last event is the head the `streams` table records (so a deleted tail or a stream whose
//! events were all deleted is found). Then the seals (`seals.rs`): a stream deleted from both
//! tables, or events moved in the log's order, no longer match the seal of their range.

mod seals;

pub(crate) use seals::{Held, StoredSeal, compare, digest_holds};

use leasehold_domain::StoreError;
use serde_json::Value;
use tokio_postgres::types::Json;

use crate::canonical::to_canonical_json;
use crate::chain::{CanonicalPieces, GENESIS_HASH, canonical_event_text, chain_hash};
use crate::limits::{VERIFY_BREAKS_MAX, VERIFY_PAGE_ROWS};
use crate::store::{PgEventStore, to_i64};

/// What is wrong at a chain break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakKind {
    /// The stored hash is not the hash of the stored fields: the event was altered.
    HashMismatch,
    /// The event does not chain from its predecessor's hash.
    PrevHashMismatch,
    /// The stream's versions are not contiguous from 1.
    VersionGap {
        /// The version that should have come next.
        expected: u64,
    },
    /// The `streams` table records more events than the log holds: the stream's last events
    /// (from `version` on) were deleted.
    EventsMissing {
        /// How many events the `streams` table records.
        recorded: u64,
    },
    /// The `streams` table records a stream of which the log holds no event at all.
    StreamMissing,
    /// The stream's last event is not the one the `streams` table records (its version is
    /// beyond the recorded head, or its hash differs): the tail was rewritten or extended
    /// outside the append path.
    HeadMismatch,
    /// The event is not where the log's order had it: within a sealed range, not where its
    /// seal lists it; after the last seal, not after its stream's previous version.
    Reordered,
    /// An event a seal lists is not in the sealed range any more (deleted, alone or with its
    /// whole stream). Its stream is not known: a seal keeps positions and hashes.
    SealedEventMissing,
    /// Another event stands where a sealed one stood: it was altered and re-hashed, or moved
    /// there from another range.
    SealedEventReplaced,
    /// The log holds an event inside a sealed range that its seal does not list.
    InsertedIntoSealedRange,
    /// The seal does not chain from the previous one, or its digest is not the hash of what
    /// it lists (the seals themselves were altered).
    SealMismatch {
        /// The seal.
        seal_no: u64,
    },
    /// An export file's line is not one of the format's, or not where the format puts it.
    Malformed {
        /// What is wrong with it.
        reason: String,
    },
    /// An export file holds fewer (or more) lines of a kind than it says it does: lines were
    /// removed from it (or added), or it was cut short.
    CountMismatch {
        /// Which lines: `events`, `seals` or `streams`.
        what: &'static str,
        /// How many it says.
        expected: u64,
        /// How many it holds.
        found: u64,
    },
    /// A complete export file holds events of a stream whose head it does not record.
    HeadMissing,
}

/// One place where a chain does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// The stream.
    pub stream_id: String,
    /// The event's version.
    pub version: u64,
    /// The event's position in the log.
    pub position: u64,
    /// The line of the export file it is on (0 when the database was checked).
    pub line: u64,
    /// What is wrong.
    pub kind: BreakKind,
}

impl std::fmt::Display for ChainBreak {
    /// Where, and what, for a person.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "line {}, ", self.line)?;
        }
        if self.stream_id.is_empty() && self.position == 0 {
            write!(f, "{:?}", self.kind)
        } else if self.stream_id.is_empty() {
            write!(
                f,
                "position {} (its event is gone; its stream is not known): {:?}",
                self.position, self.kind
            )
        } else {
            write!(
                f,
                "position {}, stream {} version {}: {:?}",
                self.position, self.stream_id, self.version, self.kind
            )
        }
    }
}

impl VerifyReport {
    /// The break at the lowest log position: where an auditor starts looking. A stream whose
    /// events are all gone has no position (0) and comes after every break that has one.
    pub fn first_break(&self) -> Option<&ChainBreak> {
        self.breaks.iter().min_by_key(|found| (found.position == 0, found.position))
    }
}

/// The result of a verification run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Events whose hashes were recomputed.
    pub events_checked: u64,
    /// Streams seen.
    pub streams_checked: u64,
    /// Seals checked against the log.
    pub seals_checked: u64,
    /// Events after the last seal, which only their chains and order vouch for.
    pub unsealed_events: u64,
    /// The breaks found, in stream order; at most [`VERIFY_BREAKS_MAX`] are listed.
    pub breaks: Vec<ChainBreak>,
    /// True when more breaks were found than are listed.
    pub breaks_truncated: bool,
}

/// Where the walk is: the previous event of the current stream.
struct Walk {
    stream_id: String,
    version: u64,
    hash: [u8; 32],
}

const PAGE_SQL: &str = "SELECT stream_id, version, position, event_id, event_type, metadata, \
     payload, recorded_at, schema_version, stream_type, tenant_id, prev_hash, hash FROM events \
     WHERE (stream_id, version) > ($1, $2) ORDER BY stream_id, version LIMIT $3";

/// Every stream whose recorded head (`streams`) is not its last stored event.
const HEADS_SQL: &str = "SELECT s.stream_id, s.version, e.version, e.position, \
     e.hash = s.last_hash FROM streams s LEFT JOIN LATERAL (SELECT version, position, hash \
     FROM events WHERE stream_id = s.stream_id ORDER BY version DESC LIMIT 1) e ON true \
     WHERE e.version IS DISTINCT FROM s.version OR e.hash IS DISTINCT FROM s.last_hash \
     ORDER BY s.stream_id";

impl PgEventStore {
    /// Walks every stream in stream-id order and checks its chain, then checks every stream's
    /// last event against the head the `streams` table records (a deleted tail or a deleted
    /// stream's events leave intact chains behind), then every seal against its range of the
    /// log and the unsealed tail's order. `progress` is called after each page with the number
    /// of events checked so far.
    pub async fn verify_log(
        &self,
        mut progress: impl FnMut(u64),
    ) -> Result<VerifyReport, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(PAGE_SQL)
            .await
            .map_err(|e| crate::store::from_driver(e, self.endpoint()))?;
        let mut report = VerifyReport::default();
        let mut walk = Walk { stream_id: String::new(), version: 0, hash: GENESIS_HASH };
        loop {
            let after_version = to_i64(walk.version);
            let rows = client
                .query(&statement, &[&walk.stream_id, &after_version, &VERIFY_PAGE_ROWS])
                .await
                .map_err(|e| crate::store::from_driver(e, self.endpoint()))?;
            for row in &rows {
                check_row(row, &mut walk, &mut report)?;
            }
            progress(report.events_checked);
            if rows.len() < usize::try_from(VERIFY_PAGE_ROWS).unwrap_or(usize::MAX) {
                break;
            }
        }
        let heads = client
            .query(HEADS_SQL, &[])
            .await
            .map_err(|e| crate::store::from_driver(e, self.endpoint()))?;
        for row in &heads {
            check_head(row, &mut report);
        }
        drop(client);
        self.verify_seals(&mut report).await?;
        Ok(report)
    }
}

/// A stream whose recorded head is not its last stored event.
fn check_head(row: &tokio_postgres::Row, report: &mut VerifyReport) {
    let recorded = u64::try_from(row.get::<_, i64>(1)).unwrap_or_default();
    let last = row.get::<_, Option<i64>>(2).map(|v| u64::try_from(v).unwrap_or_default());
    let position = row.get::<_, Option<i64>>(3).map_or(0, |p| u64::try_from(p).unwrap_or(0));
    let (version, kind) = match last {
        None => (1, BreakKind::StreamMissing),
        Some(last) if last < recorded => (last + 1, BreakKind::EventsMissing { recorded }),
        Some(last) => (last, BreakKind::HeadMismatch),
    };
    push_break(report, ChainBreak { stream_id: row.get(0), version, position, line: 0, kind });
}

pub(crate) fn push_break(report: &mut VerifyReport, found: ChainBreak) {
    if report.breaks.len() < VERIFY_BREAKS_MAX {
        report.breaks.push(found);
    } else {
        report.breaks_truncated = true;
    }
}

fn check_row(
    row: &tokio_postgres::Row,
    walk: &mut Walk,
    report: &mut VerifyReport,
) -> Result<(), StoreError> {
    let stream_id: String = row.get(0);
    let version = u64::try_from(row.get::<_, i64>(1)).unwrap_or_default();
    let position = u64::try_from(row.get::<_, i64>(2)).unwrap_or_default();
    let Json(metadata): Json<Value> = row.get(5);
    let Json(payload): Json<Value> = row.get(6);
    let corrupt = |reason: &str| StoreError::Corrupt { position, reason: reason.to_string() };
    let prev_hash: [u8; 32] =
        row.get::<_, &[u8]>(11).try_into().map_err(|_| corrupt("prev_hash is not 32 bytes"))?;
    let hash: [u8; 32] =
        row.get::<_, &[u8]>(12).try_into().map_err(|_| corrupt("hash is not 32 bytes"))?;
    let (metadata_json, payload_json) = (to_canonical_json(&metadata), to_canonical_json(&payload));
    let pieces = CanonicalPieces {
        event_id: row.get(3),
        event_type: row.get(4),
        metadata_json: &metadata_json,
        payload_json: &payload_json,
        recorded_at: row.get(7),
        schema_version: u32::try_from(row.get::<_, i32>(8)).unwrap_or(u32::MAX),
        stream_id: &stream_id,
        stream_type: row.get(9),
        tenant_id: row.get(10),
        version,
    };
    if stream_id != walk.stream_id {
        report.streams_checked += 1;
        *walk = Walk { stream_id: stream_id.clone(), version: 0, hash: GENESIS_HASH };
    }
    let mut link = Link { version: walk.version, hash: walk.hash };
    let event = Linked { pieces, position, line: 0, prev_hash, hash };
    check_link(&mut link, &event, report);
    (walk.version, walk.hash) = (link.version, link.hash);
    Ok(())
}

/// Where a stream's chain stands: its last event's version and hash (0 and the genesis hash
/// before its first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    /// The last event's version.
    pub version: u64,
    /// The last event's hash.
    pub hash: [u8; 32],
}

/// An event as a verifier reads it back.
pub(crate) struct Linked<'a> {
    /// The fields its hash covers.
    pub pieces: CanonicalPieces<'a>,
    /// Its position in the log.
    pub position: u64,
    /// Its line in an export file (0 in the database).
    pub line: u64,
    /// Its stored `prev_hash`.
    pub prev_hash: [u8; 32],
    /// Its stored `hash`.
    pub hash: [u8; 32],
}

/// Checks one event against its stream's chain so far (`link`) and records what does not
/// hold: its version follows, it chains from the previous hash, its hash is the hash of its
/// fields. `link` then stands at this event as stored, so one altered event is reported once,
/// not for the whole tail.
pub(crate) fn check_link(link: &mut Link, event: &Linked<'_>, report: &mut VerifyReport) {
    let version = event.pieces.version;
    let mut record = |kind| {
        let stream_id = event.pieces.stream_id.to_owned();
        let (position, line) = (event.position, event.line);
        push_break(report, ChainBreak { stream_id, version, position, line, kind });
    };
    if version != link.version + 1 {
        record(BreakKind::VersionGap { expected: link.version + 1 });
    } else if event.prev_hash != link.hash {
        record(BreakKind::PrevHashMismatch);
    }
    if chain_hash(&event.prev_hash, &canonical_event_text(&event.pieces)) != event.hash {
        record(BreakKind::HashMismatch);
    }
    *link = Link { version, hash: event.hash };
    report.events_checked += 1;
}
