//! The append: chain the events from the heads this process believes in and call
//! `leasehold_append`. When a belief is stale (another process appended to an "any version"
//! stream, or this one never saw the stream), the caller reads the heads again under the
//! streams' row locks, which no concurrent writer can then move, and calls once more.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use leasehold_domain::{AppendOutcome, Cursor, ExpectedVersion, StoreError};
use tokio_postgres::Row;

use super::PgEventStore;
use super::errors::{AttemptError, classify_append, from_driver};
use super::prepare::{Encoded, Head, Prepared, encode};

const APPEND_SQL: &str = "SELECT r_outcome, r_log_epoch, r_tx_id, r_position, r_stream, \
     r_expected, r_actual, r_versions, r_hashes FROM leasehold_append($1::text[], $2::text[], \
     $3::text[], $4::bigint[], $5::bool[], $6::bytea[], $7::bigint[], $8::bytea[], $9::uuid[], \
     $10::int4[], $11::bigint[], $12::text[], $13::int4[], $14::text[], $15::text[], \
     $16::bytea[], $17::bytea[], $18::timestamptz, $19::bool)";

const HEADS_SQL: &str =
    "SELECT stream_id, version, last_hash FROM streams WHERE stream_id = ANY($1::text[])";

const LOCKED_HEADS_SQL: &str = "SELECT stream_id, version, last_hash FROM streams \
     WHERE stream_id = ANY($1::text[]) ORDER BY stream_id FOR UPDATE";

/// What the database answered, before it becomes an outcome or an error.
pub(super) enum Answer {
    /// The append is settled: written, or found to be a retry.
    Settled(AppendOutcome),
    /// A head was not what this process believed: chain again from the heads under a lock.
    Stale,
}

impl PgEventStore {
    /// One call of `leasehold_append` on `client` (a pooled connection or a transaction),
    /// chained from `heads`.
    pub(super) async fn attempt<C: GenericClient>(
        &self,
        client: &C,
        prepared: &Prepared<'_>,
        heads: &[Head],
        check_event_ids: bool,
    ) -> Result<Answer, AttemptError> {
        let encoded = encode(prepared, heads, now_micros());
        let row = self.call(client, &encoded, check_event_ids).await?;
        let answer = answer(&row, prepared, &encoded).map_err(AttemptError::Fail)?;
        if let Answer::Settled(AppendOutcome { duplicate: false, .. }) = answer {
            for (s, head) in encoded.new_heads.iter().enumerate() {
                self.heads.remember(&encoded.stream_ids[s], *head);
            }
        }
        Ok(answer)
    }

    /// The head each stream is chained from on the fast path: known for a new stream, else
    /// remembered, else read (without a lock: the function checks it under one).
    pub(super) async fn believed_heads<C: GenericClient>(
        &self,
        client: &C,
        prepared: &Prepared<'_>,
    ) -> Result<Vec<Head>, AttemptError> {
        let heads: Vec<Option<Head>> = (0..prepared.sorted.len())
            .map(|s| {
                let append = prepared.stream(s);
                prepared.known_head(s).or_else(|| {
                    let remembered = self.heads.get(append.stream_id.as_str())?;
                    append.expected.admits(remembered.version).then_some(remembered)
                })
            })
            .collect();
        if heads.iter().all(Option::is_some) {
            return Ok(heads.into_iter().flatten().collect());
        }
        self.read_heads(client, prepared, HEADS_SQL).await
    }

    /// The heads read under the streams' row locks, which the transaction then holds: an
    /// append chained from them cannot find them stale.
    pub(super) async fn locked_heads<C: GenericClient>(
        &self,
        client: &C,
        prepared: &Prepared<'_>,
    ) -> Result<Vec<Head>, AttemptError> {
        self.read_heads(client, prepared, LOCKED_HEADS_SQL).await
    }

    async fn read_heads<C: GenericClient>(
        &self,
        client: &C,
        prepared: &Prepared<'_>,
        sql: &str,
    ) -> Result<Vec<Head>, AttemptError> {
        let fail = |error| AttemptError::Fail(from_driver(error, self.endpoint()));
        let ids: Vec<&str> =
            (0..prepared.sorted.len()).map(|s| prepared.stream(s).stream_id.as_str()).collect();
        let statement = client.prepare_cached(sql).await.map_err(fail)?;
        let rows = client.query(&statement, &[&ids]).await.map_err(fail)?;
        Ok((0..ids.len())
            .map(|s| {
                let found = rows.iter().find(|row| row.get::<_, &str>(0) == ids[s]);
                head_for(prepared.stream(s).expected, found.map(head_of_row))
            })
            .collect())
    }

    async fn call<C: GenericClient>(
        &self,
        client: &C,
        e: &Encoded<'_>,
        check_event_ids: bool,
    ) -> Result<Row, AttemptError> {
        let fail = |error| AttemptError::Fail(from_driver(error, self.endpoint()));
        let statement = client.prepare_cached(APPEND_SQL).await.map_err(fail)?;
        client
            .query_one(
                &statement,
                &[
                    &e.stream_ids,
                    &e.stream_types,
                    &e.tenant_ids,
                    &e.expected,
                    &e.any,
                    &e.heads,
                    &e.last_versions,
                    &e.last_hashes,
                    &e.event_ids,
                    &e.event_streams,
                    &e.versions,
                    &e.event_types,
                    &e.schema_versions,
                    &e.payloads,
                    &e.metadata,
                    &e.prev_hashes,
                    &e.hashes,
                    &e.recorded_at,
                    &check_event_ids,
                ],
            )
            .await
            .map_err(|error| classify_append(error, self.endpoint()))
    }
}

/// Timestamps are stored to the microsecond, so they are hashed at that precision.
fn now_micros() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

fn head_of_row(row: &Row) -> Head {
    let hash: &[u8] = row.get(2);
    Head {
        version: u64::try_from(row.get::<_, i64>(1)).unwrap_or_default(),
        hash: hash.try_into().unwrap_or_default(),
    }
}

/// The head to chain from, given what the stream holds. An exact expectation the stream does
/// not meet is still sent as expected: the database then tells a retry from a conflict.
fn head_for(expected: ExpectedVersion, actual: Option<Head>) -> Head {
    let actual = actual.unwrap_or(Head::EMPTY);
    match expected.required() {
        Some(version) if version != actual.version => Head { version, hash: Head::EMPTY.hash },
        _ => actual,
    }
}

fn cursor_of(row: &Row) -> Cursor {
    Cursor {
        log_epoch: u32::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
        tx_id: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
        position: u64::try_from(row.get::<_, i64>(3)).unwrap_or_default(),
    }
}

/// Turns the function's result row into an outcome, a stale report or an error.
fn answer(row: &Row, prepared: &Prepared<'_>, e: &Encoded<'_>) -> Result<Answer, StoreError> {
    let in_caller_order = |versions: &dyn Fn(usize) -> u64| {
        prepared
            .appends
            .iter()
            .enumerate()
            .map(|(caller, a)| (a.stream_id.clone(), versions(prepared.caller_order[caller])))
            .collect()
    };
    let named = |row: &Row| {
        let id: &str = row.get(4);
        prepared.appends.iter().find(|a| a.stream_id.as_str() == id)
    };
    let unknown =
        || StoreError::Database { reason: "leasehold_append named an unknown stream".into() };
    match row.get::<_, &str>(0) {
        "appended" => Ok(Answer::Settled(AppendOutcome {
            cursor: cursor_of(row),
            stream_versions: in_caller_order(&|s| e.new_heads[s].version),
            duplicate: false,
        })),
        "duplicate" => {
            let versions: Vec<Option<i64>> = row.get(7);
            let version_of = |s: usize| {
                u64::try_from(versions.get(s).copied().flatten().unwrap_or(0)).unwrap_or(0)
            };
            Ok(Answer::Settled(AppendOutcome {
                cursor: cursor_of(row),
                stream_versions: in_caller_order(&version_of),
                duplicate: true,
            }))
        }
        "stale_heads" => Ok(Answer::Stale),
        "wrong_expected_version" => {
            let append = named(row).ok_or_else(unknown)?;
            Err(StoreError::WrongExpectedVersion {
                stream: append.stream_id.clone(),
                expected: append.expected,
                actual: u64::try_from(row.get::<_, i64>(6)).unwrap_or_default(),
            })
        }
        "event_id_conflict" => Err(StoreError::EventIdConflict),
        "stream_ownership" => Err(StoreError::StreamOwnership {
            stream: named(row).ok_or_else(unknown)?.stream_id.clone(),
        }),
        other => Err(StoreError::Database { reason: format!("unknown append outcome {other}") }),
    }
}
