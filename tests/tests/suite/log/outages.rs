//! A session the server ends under a statement (`pg_terminate_backend`, a restart, a crash)
//! is the database being unavailable for a moment: a typed `StoreError::Unavailable`, which
//! callers retry (the gateway answers `UNAVAILABLE`), never a database error (`INTERNAL`).
//! The store carries on over new sessions. (Appends under terminated sessions are shown
//! against the real server: `ops/tests/gateway/outages.rs`.)

use leasehold_domain::{Cursor, EventStore, ExpectedVersion, StoreError};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, until_waiting_for_a_lock};

/// Ends every session of the test's database that waits for a lock (the store's statement,
/// held back by `holder`'s lock on the log); how many it ended.
async fn terminate_waiting(holder: &tokio_postgres::Client) -> i64 {
    let row = holder
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("terminated");
    row.get(0)
}

/// `holder` takes the log's table for itself, so that the store's next statement waits.
async fn hold_the_log(holder: &tokio_postgres::Client) {
    holder.batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE").await.expect("lock");
}

#[tokio::test]
async fn a_read_whose_session_is_terminated_is_unavailable_and_the_next_one_reconnects() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let first =
        store.append(vec![append("s-1", ExpectedVersion::NoStream, vec![event("E", json!({}))])]);
    first.await.expect("appended");
    let holder = db.client().await;
    hold_the_log(&holder).await;
    let reading = tokio::spawn({
        let store = store.clone();
        async move { store.read_log(Cursor::START, 10).await }
    });
    until_waiting_for_a_lock(&holder, None).await;
    assert_eq!(terminate_waiting(&holder).await, 1);
    let error = reading.await.expect("joined").expect_err("its session was ended");
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    holder.batch_execute("COMMIT").await.expect("released");
    // The store carries on over a new session.
    assert!(db.settled_head().await > Cursor::START);
    assert_eq!(store.read_log(Cursor::START, 10).await.expect("read again").events.len(), 1);
}
