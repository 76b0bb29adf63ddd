//! (b) Re-sending an append with the same event ids appends nothing.

use leasehold_domain::{Cursor, EventStore, ExpectedVersion, StoreError};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_log_through, read_whole_stream, stream};

#[tokio::test]
async fn resending_the_same_event_ids_returns_the_first_cursor() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let events = vec![event("Requested", json!({"n": 1})), event("Granted", json!({"n": 2}))];
    let first = store
        .append(vec![append("lease-1", ExpectedVersion::NoStream, events.clone())])
        .await
        .unwrap();
    assert!(!first.duplicate);

    // The same request again (its expected version is now stale), and with Any.
    for expected in [ExpectedVersion::NoStream, ExpectedVersion::Any, ExpectedVersion::Exact(2)] {
        let again = store.append(vec![append("lease-1", expected, events.clone())]).await.unwrap();
        assert!(again.duplicate, "{expected:?}");
        assert_eq!(again.cursor, first.cursor);
        assert_eq!(again.stream_versions, first.stream_versions);
    }
    assert_eq!(read_whole_stream(&store, &stream("lease-1"), 10).await.len(), 2);
    assert_eq!(read_log_through(&store, Cursor::START, 10, first.cursor).await.len(), 2);
}

#[tokio::test]
async fn concurrent_identical_appends_write_once() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let events = vec![event("Requested", json!({}))];
    let sends = (0..8).map(|_| {
        let store = store.clone();
        let events = events.clone();
        tokio::spawn(async move {
            store.append(vec![append("lease-2", ExpectedVersion::Any, events)]).await.unwrap()
        })
    });
    let outcomes: Vec<_> =
        futures_util::future::join_all(sends).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(outcomes.iter().filter(|o| !o.duplicate).count(), 1);
    assert!(outcomes.iter().all(|o| o.cursor == outcomes[0].cursor));
    assert_eq!(read_whole_stream(&store, &stream("lease-2"), 10).await.len(), 1);
}

#[tokio::test]
async fn reusing_some_event_ids_in_another_append_is_a_conflict() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let kept = event("Requested", json!({}));
    let first = store
        .append(vec![append("lease-3", ExpectedVersion::NoStream, vec![kept.clone()])])
        .await
        .unwrap();

    // Same id, with a new one beside it: neither a retry nor a new append.
    let mixed = vec![kept.clone(), event("Granted", json!({}))];
    let result = store.append(vec![append("lease-3", ExpectedVersion::Exact(1), mixed)]).await;
    assert!(matches!(result, Err(StoreError::EventIdConflict)), "{result:?}");

    // Same id in another stream.
    let result = store.append(vec![append("lease-4", ExpectedVersion::Any, vec![kept])]).await;
    assert!(matches!(result, Err(StoreError::EventIdConflict)), "{result:?}");
    assert_eq!(read_log_through(&store, Cursor::START, 10, first.cursor).await.len(), 1);
    assert!(read_whole_stream(&store, &stream("lease-4"), 10).await.is_empty());
    assert_eq!(read_whole_stream(&store, &stream("lease-3"), 10).await.len(), 1);
}
