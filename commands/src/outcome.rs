//! What a command answers: the outcome, or why not.

use leasehold_domain::lease::FieldError;
use leasehold_domain::{Cursor, Refusal, RefusalKind, StoreError, StreamId};

/// A command's result, the same for the first call and for every retry of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutcome {
    /// The aggregate's stream.
    pub stream_id: StreamId,
    /// The stream's version after the command.
    pub version: u64,
    /// The cursor of the command's last event (or the stream's last event, if the command
    /// changed nothing): a query may wait for the read models to reach it.
    pub cursor: Option<Cursor>,
    /// True when the operation key was recorded before: nothing was appended now.
    pub duplicate: bool,
    /// The types of the command's events, in order (empty when it changed nothing).
    pub event_types: Vec<String>,
}

/// Why a command was not carried out. Nothing was appended in any of these cases.
#[derive(Debug, thiserror::Error)]
pub enum CommandError<E: Refusal> {
    /// The input is malformed; the field is named.
    #[error("invalid input: {0}")]
    Invalid(#[from] FieldError),
    /// The aggregate refused the command.
    #[error(transparent)]
    Refused(E),
    /// The aggregate's stream belongs to another tenant or kind: to this tenant it does not
    /// exist.
    #[error("not found")]
    NotFound,
    /// The operation key was used before with a different request.
    #[error("the operation key was used before with a different request")]
    IdempotencyConflict,
    /// The caller's expected version is not the stream's.
    #[error("the stream is at version {actual}, not {expected}")]
    ConcurrencyConflict {
        /// What the caller expected.
        expected: u64,
        /// What the stream is at.
        actual: u64,
    },
    /// Concurrent commands kept winning; the caller may retry later.
    #[error("the command lost to concurrent commands {attempts} times; retry it")]
    RetriesExhausted {
        /// How many times it was decided.
        attempts: usize,
    },
    /// The store failed (unreachable, corrupt, or a database error). For logs; a client sees
    /// only that it was internal.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A command linked to this one, on an aggregate of another kind, was refused: so is this
    /// one, whole. Its message is the refusal's own: the stream it was decided on (a quota's,
    /// a host's) is the pipeline's business, not the caller's.
    #[error("{reason}")]
    LinkedRefused {
        /// The linked stream.
        stream: StreamId,
        /// What its refusal means.
        kind: RefusalKind,
        /// Its message.
        reason: String,
    },
}

fn class_of(kind: RefusalKind) -> ErrorClass {
    match kind {
        RefusalKind::BadInput => ErrorClass::BadInput,
        RefusalKind::NotFound => ErrorClass::NotFound,
        RefusalKind::InvalidState => ErrorClass::InvalidState,
        RefusalKind::Fenced => ErrorClass::Fenced,
        RefusalKind::Conflict => ErrorClass::Conflict,
        RefusalKind::QuotaExceeded => ErrorClass::QuotaExceeded,
        RefusalKind::Unsupported => ErrorClass::Unsupported,
    }
}

/// The fixed set of meanings a gateway maps to `extensions.code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// `BAD_USER_INPUT`
    BadInput,
    /// `NOT_FOUND`
    NotFound,
    /// `INVALID_STATE`
    InvalidState,
    /// `FENCED`
    Fenced,
    /// `CONFLICT` (includes a stale expected version and exhausted retries)
    Conflict,
    /// `IDEMPOTENCY_CONFLICT`
    IdempotencyConflict,
    /// `QUOTA_EXCEEDED`
    QuotaExceeded,
    /// `UNSUPPORTED`
    Unsupported,
    /// `UNAVAILABLE`: the database could not be reached. The command may or may not have
    /// been recorded (the connection can drop after the commit), so the caller sends it again
    /// with the same operation key, which makes the retry safe.
    Unavailable,
    /// `INTERNAL`
    Internal,
}

impl<E: Refusal> CommandError<E> {
    /// This error of a lookup of another kind's aggregate, as a service of kind `F` answers
    /// it: a store failure stays one; anything else means the thing looked up is not there.
    pub fn as_lookup<F: Refusal>(self) -> CommandError<F> {
        match self {
            Self::Store(error) => CommandError::Store(error),
            _ => CommandError::NotFound,
        }
    }

    /// What the error means to a caller.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Invalid(_) => ErrorClass::BadInput,
            Self::Refused(refusal) => class_of(refusal.kind()),
            Self::LinkedRefused { kind, .. } => class_of(*kind),
            Self::NotFound => ErrorClass::NotFound,
            Self::IdempotencyConflict => ErrorClass::IdempotencyConflict,
            Self::ConcurrencyConflict { .. } | Self::RetriesExhausted { .. } => {
                ErrorClass::Conflict
            }
            Self::Store(StoreError::Invalid(_)) => ErrorClass::BadInput,
            Self::Store(StoreError::Unavailable { .. }) => ErrorClass::Unavailable,
            Self::Store(_) => ErrorClass::Internal,
        }
    }
}
