//! Two processes appending to the same streams: each one's remembered stream heads go stale,
//! and every append still lands at the right version with an unbroken hash chain.

use leasehold_domain::{EventStore, ExpectedVersion, StoreError};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_whole_stream, stream};

#[tokio::test]
async fn stale_heads_from_another_process_are_refreshed_not_written() {
    let db = TestDb::migrated().await;
    let (first, second) = (db.store(), db.store());
    for n in 0..3 {
        let events = vec![event("A", json!({"n": n}))];
        first.append(vec![append("shared", ExpectedVersion::Any, events)]).await.unwrap();
    }
    // The second process has never seen the stream.
    let outcome = second
        .append(vec![append("shared", ExpectedVersion::Exact(3), vec![event("B", json!({}))])])
        .await
        .unwrap();
    assert_eq!(outcome.stream_versions[0].1, 4);
    // The first still believes the stream is at version 3.
    let outcome = first
        .append(vec![append("shared", ExpectedVersion::Any, vec![event("C", json!({}))])])
        .await
        .unwrap();
    assert_eq!(outcome.stream_versions[0].1, 5);
    let stale_exact = first
        .append(vec![append("shared", ExpectedVersion::Exact(3), vec![event("D", json!({}))])])
        .await;
    assert!(matches!(stale_exact, Err(StoreError::WrongExpectedVersion { actual: 5, .. })));

    let events = read_whole_stream(&first, &stream("shared"), 10).await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["A", "A", "A", "B", "C"]);
    let report = first.verify_log(|_| {}).await.unwrap();
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
}

#[tokio::test]
async fn appends_inside_a_caller_transaction_see_their_own_earlier_appends() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let mut connection = store.pool().get().await.unwrap();
    let tx = connection.transaction().await.unwrap();
    for n in 0..3u64 {
        let expected = if n == 0 { ExpectedVersion::NoStream } else { ExpectedVersion::Exact(n) };
        let outcome = store
            .append_in(&tx, &[append("in-tx", expected, vec![event("E", json!({"n": n}))])])
            .await
            .unwrap();
        assert_eq!(outcome.stream_versions[0].1, n + 1);
    }
    tx.commit().await.unwrap();
    let events = read_whole_stream(&store, &stream("in-tx"), 10).await;
    assert_eq!(events.len(), 3);
    assert!(events.windows(2).all(|w| w[0].cursor.tx_id == w[1].cursor.tx_id));
    assert!(store.verify_log(|_| {}).await.unwrap().breaks.is_empty());
}
