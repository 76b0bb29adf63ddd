//! The event-store port: what the rest of Leasehold needs from the log.

use std::future::Future;

use crate::{Cursor, EventId, ExpectedVersion, IdError, RecordedEvent, StreamAppend, StreamId};

/// Why an append or read was refused before it reached the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The append named no stream.
    #[error("an append must carry at least one event")]
    EmptyAppend,
    /// One stream of the append carried no event.
    #[error("the append to stream {stream} carries no event")]
    NoEventsForStream {
        /// The stream without events.
        stream: StreamId,
    },
    /// The same stream appeared twice in one append.
    #[error("stream {stream} appears more than once in one append")]
    DuplicateStream {
        /// The repeated stream.
        stream: StreamId,
    },
    /// A ledger entry named a stream its append does not write.
    #[error("the ledger entry names stream {stream}, which the append does not write")]
    LedgerStreamNotAppended {
        /// The stream named.
        stream: StreamId,
    },
    /// The same event id appeared twice in one append.
    #[error("event id {event_id} appears more than once in one append")]
    DuplicateEventId {
        /// The repeated id.
        event_id: EventId,
    },
    /// The append touched more streams than allowed.
    #[error("an append may touch at most {max} streams, this one touches {count}")]
    TooManyStreams {
        /// How many it touched.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The append carried more events than allowed.
    #[error("an append may carry at most {max} events, this one carries {count}")]
    TooManyEvents {
        /// How many it carried.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An event's payload was larger than the configured maximum.
    #[error(
        "the payload of event {event_id} is {size_bytes} bytes; at most {max_bytes} are allowed"
    )]
    PayloadTooLarge {
        /// The event.
        event_id: EventId,
        /// Its canonical JSON size.
        size_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// An event's payload or metadata held the character U+0000, which the log cannot store.
    #[error("event {event_id} holds the character U+0000, which cannot be stored")]
    NulCharacter {
        /// The event.
        event_id: EventId,
    },
    /// A read asked for a page larger than allowed, or for none at all.
    #[error("a page holds 1 to {max} events, {requested} were asked for")]
    PageSize {
        /// What was asked for.
        requested: usize,
        /// The limit.
        max: usize,
    },
    /// A name (stream id, event type, ...) was malformed.
    #[error(transparent)]
    Name(#[from] IdError),
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request was malformed; nothing was sent to the database.
    #[error("invalid request: {0}")]
    Invalid(#[from] ValidationError),
    /// A stream was not at the version the append required. Reload and decide again.
    #[error("stream {stream} was expected at {expected} but is at version {actual}")]
    WrongExpectedVersion {
        /// The stream whose version differed.
        stream: StreamId,
        /// What the append required.
        expected: ExpectedVersion,
        /// What the stream's version was.
        actual: u64,
    },
    /// Some of the append's event ids are already stored, but not as this append.
    #[error("event ids of this append are already stored as part of another append")]
    EventIdConflict,
    /// The stream exists with another owner or another aggregate kind.
    #[error("stream {stream} belongs to another tenant or aggregate kind")]
    StreamOwnership {
        /// The stream.
        stream: StreamId,
    },
    /// The append's operation key was recorded by another append first; nothing was written.
    /// Read the ledger to tell a retry from a conflicting reuse of the key.
    #[error("the operation key was recorded by another command first")]
    OperationKeyTaken,
    /// Concurrent transactions kept colliding; the caller may retry the whole operation.
    #[error("the append collided with concurrent transactions; retry it")]
    TransactionConflict,
    /// The database could not be reached. Names the endpoint, never a password.
    #[error("the database at {endpoint} is unreachable: {reason}")]
    Unavailable {
        /// `host:port` (or socket path) that was tried.
        endpoint: String,
        /// What the connection attempt reported.
        reason: String,
    },
    /// A stored row could not be read back as an event (a bug or a tampered row).
    #[error("the event at position {position} cannot be decoded: {reason}")]
    Corrupt {
        /// The row's position.
        position: u64,
        /// What was wrong with it.
        reason: String,
    },
    /// The database answered with an error. For logs only; never shown to a client.
    #[error("database error: {reason}")]
    Database {
        /// The driver's description.
        reason: String,
    },
}

/// The result of a successful append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOutcome {
    /// The cursor of the append's last event. A read-model query can wait for it.
    pub cursor: Cursor,
    /// Each stream's version after the append, in the order the append named them.
    pub stream_versions: Vec<(StreamId, u64)>,
    /// True when every event id was already stored: nothing new was written and `cursor`
    /// is the original append's.
    pub duplicate: bool,
}

/// One page of the whole log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogPage {
    /// The events, in log order.
    pub events: Vec<RecordedEvent>,
    /// The cursor to read after next: the last event's, or the one read after if empty.
    pub next: Cursor,
}

/// The log. Implemented over PostgreSQL in `leasehold-adapters`.
///
/// Every method is bounded: pages have a maximum size and appends a maximum number of events
/// (see [`crate::limits`]).
pub trait EventStore: Send + Sync {
    /// Appends to one or more streams atomically: either every stream's events are written,
    /// each stream having been at its expected version, or nothing is.
    fn append(
        &self,
        appends: Vec<StreamAppend>,
    ) -> impl Future<Output = Result<AppendOutcome, StoreError>> + Send;

    /// Reads up to `limit` events of one stream with version `>= from_version`, in version
    /// order. An unknown stream reads as empty.
    fn read_stream(
        &self,
        stream: &StreamId,
        from_version: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send;

    /// Reads up to `limit` events of the whole log that follow `after`, in commit order.
    /// Never skips an event: one whose transaction is still open holds back everything after it.
    fn read_log(
        &self,
        after: Cursor,
        limit: usize,
    ) -> impl Future<Output = Result<LogPage, StoreError>> + Send;

    /// The cursor of the last event a whole-log reader can see now ([`Cursor::START`] if none).
    fn head(&self) -> impl Future<Output = Result<Cursor, StoreError>> + Send;
}
