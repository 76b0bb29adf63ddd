//! The log taken away: an export file (NDJSON), written by [`PgEventStore::export`], checked
//! with no database by [`check::FileCheck`], restored into an empty database by
//! [`import::import`].
//!
//! A file is one JSON object per line, each with a `kind`:
//!
//! - `header` (first): the format and its version, when, which filters made it, whether it is
//!   the whole log (`complete`: no filter, stream heads included, importable), whose view
//!   (`full`, or `tenant` for a tenant's own events as its tenant views show them), and how
//!   many events and seals follow.
//! - `event`: every stored field, in commit order (`log_epoch, tx_id, position`, as the
//!   `cursor` says), hashes in hex. A tenant's view holds only its stream, version, type,
//!   time and its view of the payload: no id, tenant, metadata, hash or cursor.
//! - `seal`: right after the last event it covers, as `ledger_seals` holds it.
//! - `stream` (complete files only, after the events): each stream's head as the `streams`
//!   table records it, so that a removed last event is found; in the commit order of the
//!   event each names, so that a checker reading them ahead ([`HeadsAhead`]) holds only the
//!   streams open at one point of the log.
//! - `end` (last): what was written, so that a truncated file is found.
//!
//! [`PgEventStore::export`]: crate::PgEventStore::export

pub mod check;
mod copy_rows;
mod export;
mod heads_ahead;
pub mod import;
mod lines;

pub use export::{ExportFilter, ExportSummary};
pub use heads_ahead::HeadsAhead;
pub use lines::{
    EndLine, EventLine, EventLineRef, FORMAT, FORMAT_VERSION, Hash32, HeaderLine, Line, SealLine,
    StreamLine, TenantEventLine, View,
};

use leasehold_domain::StoreError;

/// Why taking the log away or bringing it back failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The file could not be read or written.
    #[error("the file: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not what the format says.
    #[error("line {line}: {reason}")]
    Malformed {
        /// The line (from 1).
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The file cannot be used for this (a tenant's view, a filtered export for an import).
    #[error("{0}")]
    Unsuitable(String),
    /// An import's target already holds a log.
    #[error(
        "the database already holds a log ({events} events, {streams} streams, or seals, \
         idempotency records or projection checkpoints): import into a new database"
    )]
    NotEmpty {
        /// Events it holds.
        events: u64,
        /// Streams it holds.
        streams: u64,
    },
    /// The file does not verify; nothing was imported.
    #[error("the file does not verify: {first}; nothing was imported")]
    DoesNotVerify {
        /// The first fault, for a person.
        first: String,
    },
}
