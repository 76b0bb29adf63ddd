//! One append on its own: on a pooled connection (with retries), or inside the caller's
//! transaction.

use leasehold_domain::{AppendOutcome, StoreError, StreamAppend};

use super::PgEventStore;
use super::append::Answer;
use super::errors::{AttemptError, from_driver};
use super::prepare::{Prepared, prepare};
use crate::limits::APPEND_RETRIES_MAX;

impl PgEventStore {
    /// Appends inside the caller's transaction, so that other rows (an idempotency record, a
    /// read model) commit atomically with the events. Call it before the transaction writes
    /// anything else, so its stream locks are taken before the transaction gets its id.
    /// A collision with a concurrent transaction is [`StoreError::TransactionConflict`]: roll
    /// back and run the whole transaction again. Call [`PgEventStore::notify_appended`] after
    /// committing.
    pub async fn append_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        appends: &[StreamAppend],
    ) -> Result<AppendOutcome, StoreError> {
        let prepared = prepare(appends, self.config.payload_max_bytes)?;
        let settle = async {
            let heads = self.believed_heads(tx, &prepared).await?;
            if let Answer::Settled(outcome) = self.attempt(tx, &prepared, heads, false).await? {
                return Ok(outcome);
            }
            let heads = self.locked_heads(tx, &prepared).await?;
            match self.attempt(tx, &prepared, heads, false).await? {
                Answer::Settled(outcome) => Ok(outcome),
                Answer::Stale => Err(AttemptError::Retry),
            }
        };
        match settle.await {
            Ok(outcome) => Ok(outcome),
            // Either way the transaction is aborted: the caller must run it again.
            Err(AttemptError::Retry | AttemptError::RetryCheckingEventIds) => {
                Err(StoreError::TransactionConflict)
            }
            Err(AttemptError::Fail(error)) => Err(error),
        }
    }

    /// Appends on a pooled connection: the fast path first (heads as believed), then, if a
    /// head was stale, under the streams' locks; retried after collisions with concurrent
    /// transactions.
    pub(super) async fn append_alone(
        &self,
        prepared: &Prepared<'_>,
    ) -> Result<AppendOutcome, StoreError> {
        let mut client = self.client().await?;
        let mut check_event_ids = false;
        let mut locked = false;
        for _ in 0..APPEND_RETRIES_MAX {
            let answer = if locked {
                self.append_locked(&mut client, prepared, check_event_ids).await
            } else {
                match self.believed_heads(&client, prepared).await {
                    Ok(heads) => self.attempt(&client, prepared, heads, check_event_ids).await,
                    Err(error) => Err(error),
                }
            };
            match answer {
                Ok(Answer::Settled(outcome)) => {
                    if !outcome.duplicate {
                        self.notify_appended();
                    }
                    return Ok(outcome);
                }
                Ok(Answer::Stale) => locked = true,
                Err(AttemptError::Retry) => {}
                // The next attempt tells a retry (duplicate) from a reuse (conflict).
                Err(AttemptError::RetryCheckingEventIds) => check_event_ids = true,
                Err(AttemptError::Fail(error)) => return Err(error),
            }
        }
        Err(StoreError::TransactionConflict)
    }

    /// The slow path: lock the streams, read their heads, append, commit.
    async fn append_locked(
        &self,
        client: &mut deadpool_postgres::Object,
        prepared: &Prepared<'_>,
        check_event_ids: bool,
    ) -> Result<Answer, AttemptError> {
        let fail = |error| AttemptError::Fail(from_driver(error, &self.endpoint));
        let tx = client.transaction().await.map_err(fail)?;
        let heads = self.locked_heads(&tx, prepared).await?;
        let answer = self.attempt(&tx, prepared, heads, check_event_ids).await?;
        // Dropping an uncommitted transaction rolls it back.
        if let Answer::Settled(AppendOutcome { duplicate: false, .. }) = answer {
            tx.commit().await.map_err(fail)?;
        }
        Ok(answer)
    }
}
