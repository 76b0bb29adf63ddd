//! The ledger row is an append's first write on both paths (the one-statement path and the
//! checked one), so an append waiting for an operation key holds nothing else yet: a retry
//! racing its original on the other path cannot deadlock with it.
//!
//! The appends here call `leasehold_append` directly, with arrays built by hand, to hold each
//! one at a known point; the store's own callers go through the same function.

use std::time::Duration;

use leasehold_tests::TestDb;
use tokio_postgres::Client;

use crate::support::until_waiting_for_a_lock;

const ZERO: &str = "'\\x0000000000000000000000000000000000000000000000000000000000000000'::bytea";
const HASH: &str = "'\\x1111111111111111111111111111111111111111111111111111111111111111'::bytea";
const EVENT_ID: &str = "0190a5b6-0000-7000-8000-00000000e001";
const KEY: &str = "op-1";

/// One append of one event to the new stream `ledger-order-1`, recording `KEY`.
fn append_sql(check_event_ids: bool) -> String {
    format!(
        "SELECT r_outcome FROM leasehold_append(
            ARRAY['ledger-order-1'], ARRAY[1], ARRAY[1], ARRAY['test'], ARRAY['acme'],
            ARRAY[0::bigint], ARRAY[false], ARRAY[{ZERO}], ARRAY[1], ARRAY[1],
            ARRAY[1], ARRAY['{EVENT_ID}'::uuid], ARRAY['Happened'], ARRAY[1],
            ARRAY['{{}}'], ARRAY['{{}}'], ARRAY[{HASH}], ARRAY[1], now(), {check_event_ids},
            ARRAY[1], ARRAY['acme'], ARRAY['{KEY}'], ARRAY[{HASH}], ARRAY['ledger-order-1'],
            ARRAY[1::bigint], ARRAY[1::bigint], ARRAY['tenant'], ARRAY['ledger-order-1'],
            ARRAY[1::bigint])"
    )
}

async fn pid_of(client: &Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).await.expect("a pid").get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_waiting_for_its_key_holds_no_stream_or_event_yet_and_racing_retries_settle() {
    let db = TestDb::migrated().await;
    // Another transaction holds the key.
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.expect("begun");
    holder
        .execute(
            "INSERT INTO idempotency (tenant_id, namespace, operation_key, request_hash, \
             stream_id, first_version, last_version) VALUES ('acme', 'tenant', $1, $2, 'x', 1, 1)",
            &[&KEY, &vec![0x11u8; 32]],
        )
        .await
        .expect("the key is held");

    // The original, on the one-statement path, and a retry of it on the checked path both
    // wait for the key.
    let original = db.client().await;
    let retry = db.client().await;
    let observer = db.client().await;
    let (original_pid, retry_pid) = (pid_of(&original).await, pid_of(&retry).await);
    let original_call = tokio::spawn(async move { original.query(&append_sql(false), &[]).await });
    until_waiting_for_a_lock(&observer, Some(original_pid)).await;
    let retry_call = tokio::spawn(async move { retry.query(&append_sql(true), &[]).await });
    until_waiting_for_a_lock(&observer, Some(retry_pid)).await;

    // Neither holds the stream row or the event id: another transaction takes and releases
    // both without waiting.
    let prober = db.client().await;
    prober.batch_execute("BEGIN; SET LOCAL lock_timeout = '2s'").await.expect("begun");
    prober
        .batch_execute(&format!(
            "INSERT INTO streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id) \
             VALUES ('ledger-order-1', 'test', 'acme', 1, {HASH}, pg_current_xact_id());
             INSERT INTO events (event_id, stream_id, version, stream_type, tenant_id, event_type, \
             schema_version, payload, metadata, recorded_at, prev_hash, hash) VALUES \
             ('{EVENT_ID}', 'elsewhere', 1, 'test', 'acme', 'Probe', 1, '{{}}', '{{}}', now(), {ZERO}, {HASH});"
        ))
        .await
        .expect("nothing of the waiting appends is written before their key");
    prober.batch_execute("ROLLBACK").await.expect("rolled back");

    // The key's holder gives up: one append takes the key and commits, the other settles
    // without a deadlock (a duplicate, a taken key, or a unique violation the store retries
    // on the checked path).
    holder.batch_execute("ROLLBACK").await.expect("released");
    let settle = |call: tokio::task::JoinHandle<Result<Vec<tokio_postgres::Row>, _>>| async {
        match tokio::time::timeout(Duration::from_secs(30), call).await {
            Ok(joined) => joined.expect("the call task"),
            Err(_) => panic!("an append did not settle in time"),
        }
    };
    for answer in [settle(original_call).await, settle(retry_call).await] {
        if let Err(error) = answer {
            let code = error.as_db_error().map(|db| db.code().code().to_string());
            assert_ne!(code.as_deref(), Some("40P01"), "a deadlock: {error}");
            assert_eq!(code.as_deref(), Some("23505"), "only the key's unique violation: {error}");
        }
    }
    let stored = db.client().await;
    let events: i64 = stored
        .query_one("SELECT count(*) FROM events WHERE stream_id = 'ledger-order-1'", &[])
        .await
        .expect("counted")
        .get(0);
    assert_eq!(events, 1);
}
