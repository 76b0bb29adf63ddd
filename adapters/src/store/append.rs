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
use super::prepare::{Encoded, Head, Member, Prepared, encode};

const APPEND_SQL: &str = "SELECT r_append, r_outcome, r_log_epoch, r_tx_id, r_position, \
     r_stream, r_expected, r_actual, r_versions FROM leasehold_append($1::text[], $2::int4[], \
     $3::int4[], $4::text[], $5::text[], $6::bigint[], $7::bool[], $8::bytea[], $9::int4[], \
     $10::int4[], $11::int4[], $12::uuid[], $13::text[], $14::int4[], $15::text[], $16::text[], \
     $17::bytea[], $18::int4[], $19::timestamptz, $20::bool, $21::int4[], $22::text[], \
     $23::text[], $24::bytea[], $25::text[], $26::bigint[], $27::bigint[], $28::text[], \
     $29::text[], $30::bigint[])";

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
    /// One call of `leasehold_append` on `client` (a pooled connection or a transaction) for
    /// a group of appends, each chained from its heads. Returns each append's answer; an
    /// `Err` means the whole call failed and nothing of it was written.
    pub(super) async fn attempt_group<C: GenericClient>(
        &self,
        client: &C,
        group: &[Member<'_>],
        check_event_ids: bool,
    ) -> Result<Vec<Result<Answer, StoreError>>, AttemptError> {
        let encoded = encode(group, now_micros());
        let rows = self.call(client, &encoded, check_event_ids).await?;
        let answers = answers(&rows, group, &encoded);
        for (number, answer) in answers.iter().enumerate() {
            if let Ok(Answer::Settled(AppendOutcome { duplicate: false, .. })) = answer {
                let (prepared, _) = &group[number];
                for (s, head) in encoded.new_heads[number].iter().enumerate() {
                    self.heads.remember(prepared.stream(s).stream_id.as_str(), *head);
                }
            }
        }
        Ok(answers)
    }

    /// One call for one append.
    pub(super) async fn attempt<C: GenericClient>(
        &self,
        client: &C,
        prepared: &Prepared<'_>,
        heads: Vec<Head>,
        check_event_ids: bool,
    ) -> Result<Answer, AttemptError> {
        let group = [(prepared, heads)];
        let answer = self.attempt_group(client, &group, check_event_ids).await?.pop();
        let missing = || StoreError::Database { reason: "leasehold_append gave no answer".into() };
        answer.unwrap_or_else(|| Err(missing())).map_err(AttemptError::Fail)
    }

    /// The heads known without asking the database (a new stream's, or remembered ones that
    /// meet the expected versions), or `None` if any is unknown.
    pub(super) fn remembered_heads(&self, prepared: &Prepared<'_>) -> Option<Vec<Head>> {
        (0..prepared.sorted.len())
            .map(|s| {
                let append = prepared.stream(s);
                prepared.known_head(s).or_else(|| {
                    let remembered = self.heads.get(append.stream_id.as_str())?;
                    append.expected.admits(remembered.version).then_some(remembered)
                })
            })
            .collect()
    }

    /// The head each stream is chained from on the fast path: known for a new stream, else
    /// remembered, else read (without a lock: the function checks it under one).
    pub(super) async fn believed_heads<C: GenericClient>(
        &self,
        client: &C,
        prepared: &Prepared<'_>,
    ) -> Result<Vec<Head>, AttemptError> {
        match self.remembered_heads(prepared) {
            Some(heads) => Ok(heads),
            None => self.read_heads(client, prepared, HEADS_SQL).await,
        }
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
    ) -> Result<Vec<Row>, AttemptError> {
        let fail = |error| AttemptError::Fail(from_driver(error, self.endpoint()));
        let statement = client.prepare_cached(APPEND_SQL).await.map_err(fail)?;
        let entry_heads: Vec<&[u8]> = e.entry_head.iter().map(|h| h.as_slice()).collect();
        let event_hashes: Vec<&[u8]> = e.event_hashes.iter().map(|h| h.as_slice()).collect();
        // Without ledger rows (most appends) the ten ledger arrays go as NULL, which the
        // function reads as empty: the server then neither receives nor expands them.
        let l = (!e.ledger.append.is_empty()).then_some(&e.ledger);
        client
            .query(
                &statement,
                &[
                    &e.streams,
                    &e.entry_append,
                    &e.entry_stream,
                    &e.entry_type,
                    &e.entry_tenant,
                    &e.entry_expected,
                    &e.entry_any,
                    &entry_heads,
                    &e.entry_first,
                    &e.entry_events,
                    &e.event_entry,
                    &e.event_ids,
                    &e.event_types,
                    &e.event_schema_versions,
                    &e.event_payloads,
                    &e.event_metadata,
                    &event_hashes,
                    &e.append_events,
                    &e.recorded_at,
                    &check_event_ids,
                    &l.map(|l| &l.append),
                    &l.map(|l| &l.tenant),
                    &l.map(|l| &l.key),
                    &l.map(|l| &l.hash),
                    &l.map(|l| &l.stream),
                    &l.map(|l| &l.first),
                    &l.map(|l| &l.last),
                    &l.map(|l| &l.namespace),
                    &l.map(|l| &l.cursor_stream),
                    &l.map(|l| &l.cursor_version),
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
        log_epoch: u32::try_from(row.get::<_, i32>(2)).unwrap_or_default(),
        tx_id: u64::try_from(row.get::<_, i64>(3)).unwrap_or_default(),
        position: u64::try_from(row.get::<_, i64>(4)).unwrap_or_default(),
    }
}

/// Each append's answer, from the function's rows (one per append).
fn answers(rows: &[Row], group: &[Member<'_>], e: &Encoded<'_>) -> Vec<Result<Answer, StoreError>> {
    let missing =
        || Err(StoreError::Database { reason: "leasehold_append skipped an append".into() });
    let mut answers: Vec<Result<Answer, StoreError>> = group.iter().map(|_| missing()).collect();
    for row in rows {
        let number = usize::try_from(row.get::<_, i32>(0)).unwrap_or_default();
        if let (Some(slot), Some((prepared, _))) =
            (answers.get_mut(number.wrapping_sub(1)), group.get(number.wrapping_sub(1)))
        {
            *slot = answer(row, prepared, &e.new_heads[number - 1]);
        }
    }
    answers
}

/// Turns one append's row into an outcome, a stale report or an error.
fn answer(row: &Row, prepared: &Prepared<'_>, new_heads: &[Head]) -> Result<Answer, StoreError> {
    let in_caller_order = |versions: &dyn Fn(usize) -> u64| {
        prepared
            .appends
            .iter()
            .enumerate()
            .map(|(caller, a)| (a.stream_id.clone(), versions(prepared.caller_order[caller])))
            .collect()
    };
    let named = || {
        let id: Option<&str> = row.get(5);
        prepared.appends.iter().find(|a| Some(a.stream_id.as_str()) == id).ok_or_else(|| {
            StoreError::Database { reason: "leasehold_append named an unknown stream".into() }
        })
    };
    match row.get::<_, &str>(1) {
        "appended" => Ok(Answer::Settled(AppendOutcome {
            cursor: cursor_of(row),
            stream_versions: in_caller_order(&|s| new_heads[s].version),
            duplicate: false,
        })),
        "duplicate" => {
            let versions: Vec<Option<i64>> = row.get(8);
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
            let append = named()?;
            Err(StoreError::WrongExpectedVersion {
                stream: append.stream_id.clone(),
                expected: append.expected,
                actual: u64::try_from(row.get::<_, i64>(7)).unwrap_or_default(),
            })
        }
        "event_id_conflict" => Err(StoreError::EventIdConflict),
        "operation_key_taken" => Err(StoreError::OperationKeyTaken),
        "stream_ownership" => {
            Err(StoreError::StreamOwnership { stream: named()?.stream_id.clone() })
        }
        other => Err(StoreError::Database { reason: format!("unknown append outcome {other}") }),
    }
}
