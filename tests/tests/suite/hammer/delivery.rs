//! How a command reaches the pipeline, with the faults a client meets on the way: the reply
//! lost (the client sends the command again with its key), and every database session
//! ended after the append (the client's retry, and whatever runs next, find their sessions
//! gone). Either way the client's contract holds: `UNAVAILABLE` is sent again with the same
//! key, and a command sent again appends nothing more and answers as it did.

use std::future::Future;

use leasehold_commands::{CommandError, ErrorClass};
use leasehold_domain::Refusal;

use super::{Answer, answer};

/// A fault injected into one command's delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Delivered once, answered.
    None,
    /// The reply was lost: sent again with the same key.
    Redelivered,
    /// Every session of the database ended after the append (`pg_terminate_backend`, as a
    /// failover would), then sent again with the same key.
    SessionsDropped,
}

/// A connection of the test's own, outside every pool, to look at the log and end sessions.
pub struct Observer {
    client: tokio_postgres::Client,
}

impl Observer {
    pub async fn on(db: &leasehold_tests::TestDb) -> Observer {
        Observer { client: db.client().await }
    }

    async fn log_length(&self) -> i64 {
        let row = self.client.query_one("SELECT count(*) FROM events", &[]).await;
        row.expect("the log is countable").get(0)
    }

    /// Ends every other session of this database: the pools', the projectors'.
    pub async fn drop_sessions(&self) {
        let end = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                   WHERE datname = current_database() AND pid <> pg_backend_pid()";
        self.client.query_one(end, &[]).await.expect("sessions ended");
    }
}

/// Attempts at a command answered `UNAVAILABLE` (a pooled session found ended) before the
/// client gives up: more than a pool has sessions.
const RETRIES: usize = 20;

/// Sends a command as a client does, retrying `UNAVAILABLE` with the same key.
async fn send_retrying<T, E, F, Fut>(send: &F) -> Result<T, CommandError<E>>
where
    E: Refusal,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, CommandError<E>>>,
{
    let mut result = send().await;
    for _ in 0..RETRIES {
        match &result {
            Err(error) if error.class() == ErrorClass::Unavailable => result = send().await,
            _ => break,
        }
    }
    result
}

/// Delivers the command `send` sends (always with the same key) under `fault`; the first
/// answer, or a failure when sending it again appended anything or answered otherwise.
pub async fn deliver<T, E, F, Fut>((fault, observer): (Fault, &Observer), send: F) -> Answer
where
    E: Refusal,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, CommandError<E>>>,
{
    let first = send_retrying(&send).await;
    if fault == Fault::None {
        return answer(first);
    }
    if fault == Fault::SessionsDropped {
        observer.drop_sessions().await;
    }
    let before = observer.log_length().await;
    let again = send_retrying(&send).await;
    let appended = observer.log_length().await - before;
    let classes = (
        first.as_ref().err().map(CommandError::class),
        again.as_ref().err().map(CommandError::class),
    );
    if appended != 0 || classes.0 != classes.1 {
        return Answer::Failed(format!(
            "sent again ({fault:?}): {appended} events appended, answered {:?} then {:?}",
            classes.0, classes.1
        ));
    }
    answer(first)
}
