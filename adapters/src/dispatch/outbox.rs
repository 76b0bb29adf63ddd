//! The `dispatch_outbox` table (migration 0010): each dispatcher's work still to send.

use chrono::{DateTime, Utc};
use leasehold_domain::{StoreError, StreamId, TenantId};
use uuid::Uuid;

use super::{Intent, Work};
use crate::store::{PgEventStore, from_driver, from_pool};

/// One row, as operators see it (`leasehold dispatch status` and tests).
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    /// The stream.
    pub stream: String,
    /// The work's generation.
    pub generation: u64,
    /// Who is called.
    pub target: String,
    /// What is asked.
    pub action: String,
    /// `pending`, `delivered`, `refused`, `superseded` or `lapsed`.
    pub state: String,
    /// Attempts claimed.
    pub attempts: u32,
    /// Operator-only: why the last attempt failed.
    pub last_error: Option<String>,
}

/// The outbox, over the log's pool.
#[derive(Debug, Clone)]
pub struct PgOutbox {
    log: PgEventStore,
}

type Key<'a> = (&'a StreamId, u64);

impl PgOutbox {
    /// The outbox in the database `log` is in.
    pub fn new(log: PgEventStore) -> Self {
        Self { log }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        let endpoint = self.log.endpoint();
        self.log.pool().get().await.map_err(|error| from_pool(error, endpoint))
    }

    fn fail(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        |error| from_driver(error, self.log.endpoint())
    }

    /// Records `intents` as pending work of `dispatcher` (an intent already recorded is left
    /// as it is) and supersedes pending older work on their streams.
    ///
    /// # Errors
    /// A database failure.
    pub async fn enqueue(
        &self,
        dispatcher: &str,
        intents: &[Intent],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.enqueue_beside(dispatcher, (intents, &[]), now).await
    }

    /// As [`Self::enqueue`], with work of the actions in `beside` running beside its
    /// stream's other work: it supersedes nothing and nothing supersedes it (a snapshot's
    /// exports, each to its own destination, beside its restore).
    ///
    /// # Errors
    /// A database failure.
    pub async fn enqueue_beside(
        &self,
        dispatcher: &str,
        (intents, beside): (&[Intent], &[&str]),
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if intents.is_empty() {
            return Ok(());
        }
        let aside = |intent: &Intent| beside.contains(&intent.action);
        let column = |f: fn(&Intent) -> String| intents.iter().map(f).collect::<Vec<_>>();
        let streams = column(|i| i.stream.as_str().to_string());
        let generations: Vec<i64> = intents.iter().map(|i| to_i64(i.generation)).collect();
        let event_ids: Vec<uuid::Uuid> = intents.iter().map(|i| i.event_id.as_uuid()).collect();
        let tenants = column(|i| i.tenant.as_str().to_string());
        let targets = column(|i| i.target.clone());
        let actions = column(|i| i.action.to_string());
        let requests: Vec<serde_json::Value> = intents.iter().map(|i| i.request.clone()).collect();
        // Within the batch too, only a stream's newest work is pending: the older is
        // superseded from the start (one statement cannot see what it inserts).
        let mut newest: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for intent in intents.iter().filter(|intent| !aside(intent)) {
            let entry = newest.entry(intent.stream.as_str()).or_insert(intent.generation);
            *entry = (*entry).max(intent.generation);
        }
        let states: Vec<&str> = intents
            .iter()
            .map(|i| match newest.get(i.stream.as_str()) {
                Some(newer) if !aside(i) && i.generation < *newer => "superseded",
                _ => "pending",
            })
            .collect();
        let client = self.client().await?;
        client
            .execute(
                "WITH taken AS ( \
                   INSERT INTO dispatch_outbox (stream_id, generation, event_id, tenant_id, \
                     dispatcher, target, action, request, state, next_attempt_at, recorded_at) \
                   SELECT s, g, e, t, $7, tg, a, r, st, $8, $8 \
                   FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::text[], \
                               $6::text[], $9::jsonb[], $10::text[]) AS i(s, g, e, t, tg, a, r, st) \
                   ON CONFLICT DO NOTHING) \
                 UPDATE dispatch_outbox o SET state = 'superseded', settled_at = $8 \
                 FROM unnest($1::text[], $2::bigint[], $6::text[]) AS i(s, g, a) \
                 WHERE o.stream_id = i.s AND o.generation < i.g AND o.state = 'pending' \
                   AND NOT (i.a = ANY($11::text[])) AND NOT (o.action = ANY($11::text[]))",
                &[
                    &streams,
                    &generations,
                    &event_ids,
                    &tenants,
                    &targets,
                    &actions,
                    &dispatcher,
                    &now,
                    &requests,
                    &states,
                    &beside,
                ],
            )
            .await
            .map_err(self.fail())?;
        Ok(())
    }

    /// Claims up to `limit` of `dispatcher`'s work due at `now`, oldest due first: each row's
    /// attempt count rises by one, the work carries the new number, and the row is not due
    /// again until `hold` (its answer reschedules or ends it before then).
    ///
    /// # Errors
    /// A database failure, or a row that does not decode.
    pub async fn claim_due(
        &self,
        (dispatcher, claimer): (&str, Uuid),
        now: DateTime<Utc>,
        limit: usize,
        hold: DateTime<Utc>,
    ) -> Result<Vec<Work>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "UPDATE dispatch_outbox o SET attempts = o.attempts + 1, next_attempt_at = $4, \
                   claimed_by = $5 \
                 FROM ( \
                   SELECT stream_id, generation FROM dispatch_outbox \
                   WHERE dispatcher = $1 AND state = 'pending' AND next_attempt_at <= $2 \
                   ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED) due \
                 WHERE o.stream_id = due.stream_id AND o.generation = due.generation \
                 RETURNING o.stream_id, o.generation, o.tenant_id, o.target, o.action, \
                   o.request, o.attempts",
                &[&dispatcher, &now, &limit, &hold, &claimer],
            )
            .await
            .map_err(self.fail())?;
        rows.iter().map(work_of).collect()
    }

    /// Makes `dispatcher`'s pending work of `actions` claimed by any instance but `claimer`
    /// due at `now`: such a claim was left by an instance that no longer holds the
    /// dispatcher's lock (gone mid-send). How many rows it freed.
    ///
    /// # Errors
    /// A database failure.
    pub async fn free_claims_of_others(
        &self,
        (dispatcher, claimer): (&str, Uuid),
        actions: &[&str],
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE dispatch_outbox SET next_attempt_at = $3, claimed_by = NULL \
                 WHERE dispatcher = $1 AND state = 'pending' AND action = ANY($4) \
                   AND claimed_by IS NOT NULL AND claimed_by <> $2",
                &[&dispatcher, &claimer, &now, &actions],
            )
            .await
            .map_err(self.fail())
    }

    /// Ends `key`'s work as taken by its target, to be settled by `answer_by` if it has a
    /// deadline.
    ///
    /// # Errors
    /// A database failure.
    pub async fn deliver(
        &self,
        key: Key<'_>,
        now: DateTime<Utc>,
        answer_by: Option<DateTime<Utc>>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE dispatch_outbox SET state = 'delivered', settled_at = $3, answer_by = $4 \
                 WHERE stream_id = $1 AND generation = $2 AND state = 'pending'",
                &[&key.0.as_str(), &to_i64(key.1), &now, &answer_by],
            )
            .await
            .map_err(self.fail())?;
        Ok(())
    }

    /// Up to `limit` of `dispatcher`'s delivered work whose answer was due by `now`, the
    /// attempt it was delivered on as its number.
    ///
    /// # Errors
    /// A database failure, or a row that does not decode.
    pub async fn overdue(
        &self,
        dispatcher: &str,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Work>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT stream_id, generation, tenant_id, target, action, request, attempts \
                 FROM dispatch_outbox WHERE dispatcher = $1 AND state = 'delivered' \
                 AND answer_by <= $2 ORDER BY answer_by LIMIT $3",
                &[&dispatcher, &now, &limit],
            )
            .await
            .map_err(self.fail())?;
        rows.iter().map(work_of).collect()
    }

    /// Delivered work `key`'s deadline was handled: it `lapsed` (recorded as the work's
    /// failure), or it had been settled in time (its deadline is dropped).
    ///
    /// # Errors
    /// A database failure.
    pub async fn lapse(&self, key: Key<'_>, lapsed: bool) -> Result<(), StoreError> {
        let client = self.client().await?;
        let state = if lapsed { "lapsed" } else { "delivered" };
        client
            .execute(
                "UPDATE dispatch_outbox SET state = $3, answer_by = NULL \
                 WHERE stream_id = $1 AND generation = $2 AND state = 'delivered'",
                &[&key.0.as_str(), &to_i64(key.1), &state],
            )
            .await
            .map_err(self.fail())?;
        Ok(())
    }

    /// Ends `key`'s work in `state` (delivered, refused or superseded).
    ///
    /// # Errors
    /// A database failure.
    pub async fn finish(
        &self,
        key: Key<'_>,
        state: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE dispatch_outbox SET state = $3, settled_at = $4 \
                 WHERE stream_id = $1 AND generation = $2 AND state = 'pending'",
                &[&key.0.as_str(), &to_i64(key.1), &state, &now],
            )
            .await
            .map_err(self.fail())?;
        Ok(())
    }

    /// After failed attempt `attempt`: the work is due again at `next`.
    ///
    /// # Errors
    /// A database failure.
    pub async fn retry(
        &self,
        key: Key<'_>,
        attempt: u32,
        next: DateTime<Utc>,
        detail: &str,
    ) -> Result<(), StoreError> {
        self.reschedule(key, (attempt, attempt), next, detail).await
    }

    /// Attempt `attempt` was not sent: its number is given back and the work is due at `next`.
    ///
    /// # Errors
    /// A database failure.
    pub async fn give_back(
        &self,
        key: Key<'_>,
        attempt: u32,
        next: DateTime<Utc>,
        detail: &str,
    ) -> Result<(), StoreError> {
        self.reschedule(key, (attempt, attempt - 1), next, detail).await
    }

    async fn reschedule(
        &self,
        key: Key<'_>,
        (claimed, attempts): (u32, u32),
        next: DateTime<Utc>,
        detail: &str,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE dispatch_outbox SET attempts = $4, next_attempt_at = $5, last_error = $6, \
                   claimed_by = NULL \
                 WHERE stream_id = $1 AND generation = $2 AND attempts = $3 AND state = 'pending'",
                &[
                    &key.0.as_str(),
                    &to_i64(key.1),
                    &i32::try_from(claimed).unwrap_or(i32::MAX),
                    &i32::try_from(attempts).unwrap_or(i32::MAX),
                    &next,
                    &detail,
                ],
            )
            .await
            .map_err(self.fail())?;
        Ok(())
    }

    /// When `dispatcher`'s next pending work is due and its earliest answer deadline, if any.
    ///
    /// # Errors
    /// A database failure.
    pub async fn next_times(
        &self,
        dispatcher: &str,
    ) -> Result<(Option<DateTime<Utc>>, Option<DateTime<Utc>>), StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT (SELECT min(next_attempt_at) FROM dispatch_outbox \
                         WHERE dispatcher = $1 AND state = 'pending'), \
                        (SELECT min(answer_by) FROM dispatch_outbox \
                         WHERE dispatcher = $1 AND state = 'delivered' AND answer_by IS NOT NULL)",
                &[&dispatcher],
            )
            .await
            .map_err(self.fail())?;
        Ok((row.get(0), row.get(1)))
    }

    /// When `dispatcher` next has something to do: pending work due, or a delivered piece's
    /// answer deadline, if it has any.
    ///
    /// # Errors
    /// A database failure.
    pub async fn next_due(&self, dispatcher: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(earliest(self.next_times(dispatcher).await?))
    }

    /// Every row of `dispatcher`, by stream and generation.
    ///
    /// # Errors
    /// A database failure.
    pub async fn rows(&self, dispatcher: &str) -> Result<Vec<OutboxRow>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT stream_id, generation, target, action, state, attempts, last_error \
                 FROM dispatch_outbox WHERE dispatcher = $1 ORDER BY stream_id, generation",
                &[&dispatcher],
            )
            .await
            .map_err(self.fail())?;
        Ok(rows
            .iter()
            .map(|row| OutboxRow {
                stream: row.get(0),
                generation: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                target: row.get(2),
                action: row.get(3),
                state: row.get(4),
                attempts: u32::try_from(row.get::<_, i32>(5)).unwrap_or(0),
                last_error: row.get(6),
            })
            .collect())
    }
}

fn work_of(row: &tokio_postgres::Row) -> Result<Work, StoreError> {
    let bad = |what: &str| StoreError::Database {
        reason: format!("an outbox row's {what} does not decode"),
    };
    Ok(Work {
        stream: StreamId::parse(row.get::<_, String>(0)).map_err(|_| bad("stream"))?,
        generation: u64::try_from(row.get::<_, i64>(1)).map_err(|_| bad("generation"))?,
        tenant: TenantId::parse(row.get::<_, String>(2)).map_err(|_| bad("tenant"))?,
        target: row.get(3),
        action: row.get(4),
        request: row.get(5),
        attempt: u32::try_from(row.get::<_, i32>(6)).map_err(|_| bad("attempts"))?,
    })
}

/// The earlier of a next due time and an answer deadline, either of which may be absent.
pub fn earliest(
    (due, deadline): (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
) -> Option<DateTime<Utc>> {
    match (due, deadline) {
        (Some(due), Some(deadline)) => Some(due.min(deadline)),
        (due, deadline) => due.or(deadline),
    }
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
