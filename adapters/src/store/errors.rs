//! Mapping driver and pool errors to the store's typed errors, in one place.

use leasehold_domain::StoreError;
use tokio_postgres::error::SqlState;

/// What to do with a failed append attempt.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// A collision with a concurrent transaction: run the whole append again.
    Retry,
    /// An event id is already stored: run again, asking whether this append is a retry.
    RetryCheckingEventIds,
    /// Give up with this error.
    Fail(StoreError),
}

/// Classifies a driver error raised by an append.
pub(crate) fn classify_append(error: tokio_postgres::Error, endpoint: &str) -> AttemptError {
    let Some(db) = error.as_db_error() else {
        return AttemptError::Fail(unavailable_or_database(error, endpoint));
    };
    let code = db.code();
    if session_ended(code) {
        return AttemptError::Fail(unavailable(endpoint, db));
    }
    // A lock waited for longer than the append function's lock_timeout is a collision too:
    // retried (a bounded number of times), never waited for without end.
    if code == &SqlState::T_R_SERIALIZATION_FAILURE
        || code == &SqlState::T_R_DEADLOCK_DETECTED
        || code == &SqlState::LOCK_NOT_AVAILABLE
    {
        return AttemptError::Retry;
    }
    if code == &SqlState::UNIQUE_VIOLATION {
        return match db.constraint() {
            // A stream created by a concurrent append (the stream row or its first versions,
            // whichever the statement wrote first): retry and meet it as an existing stream.
            Some("streams_pkey" | "events_stream_id_version_key") => AttemptError::Retry,
            // An event id already stored, or an operation key another append recorded first:
            // run again on the checked path, which tells a retry from a conflict.
            Some("events_event_id_key" | "idempotency_pkey") => AttemptError::RetryCheckingEventIds,
            _ => AttemptError::Fail(StoreError::Database { reason: db.to_string() }),
        };
    }
    AttemptError::Fail(StoreError::Database { reason: db.to_string() })
}

/// A driver error outside an append.
pub(crate) fn from_driver(error: tokio_postgres::Error, endpoint: &str) -> StoreError {
    match error.as_db_error() {
        Some(db) if session_ended(db.code()) => unavailable(endpoint, db),
        Some(db) => StoreError::Database { reason: db.to_string() },
        None => unavailable_or_database(error, endpoint),
    }
}

/// Whether the server ended the session rather than refused the statement: terminated by an
/// administrator (`pg_terminate_backend`, a fast shutdown), a crash of another backend, a
/// server still starting, or a connection exception (class 08). The same statement on a new
/// session may succeed: the database is unavailable for a moment, not in error.
fn session_ended(code: &SqlState) -> bool {
    code == &SqlState::ADMIN_SHUTDOWN
        || code == &SqlState::CRASH_SHUTDOWN
        || code == &SqlState::CANNOT_CONNECT_NOW
        || code.code().starts_with("08")
}

fn unavailable(endpoint: &str, db: &tokio_postgres::error::DbError) -> StoreError {
    StoreError::Unavailable { endpoint: endpoint.to_string(), reason: db.message().to_string() }
}

fn unavailable_or_database(error: tokio_postgres::Error, endpoint: &str) -> StoreError {
    // Only a broken connection means the database is unreachable; an encoding error (which
    // also has a source) is a bug to log.
    let io = std::error::Error::source(&error).is_some_and(|source| source.is::<std::io::Error>());
    if error.is_closed() || io {
        StoreError::Unavailable { endpoint: endpoint.to_string(), reason: error.to_string() }
    } else {
        StoreError::Database { reason: error.to_string() }
    }
}

/// A pool error: the database could not be reached, or no connection freed up in time.
pub(crate) fn from_pool(error: deadpool_postgres::PoolError, endpoint: &str) -> StoreError {
    use deadpool_postgres::PoolError;
    match error {
        PoolError::Backend(error) => {
            StoreError::Unavailable { endpoint: endpoint.to_string(), reason: error.to_string() }
        }
        PoolError::Timeout(kind) => StoreError::Unavailable {
            endpoint: endpoint.to_string(),
            reason: format!("timed out ({kind:?})"),
        },
        other => StoreError::Database { reason: other.to_string() },
    }
}
