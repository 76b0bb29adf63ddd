//! (c) A multi-stream append is all or nothing.

use leasehold_domain::{Cursor, EventStore, ExpectedVersion, StoreError, StreamAppend, TenantId};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_log_through, read_whole_stream, stream};

#[tokio::test]
async fn one_wrong_expected_version_writes_nothing_to_any_stream() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let first = store
        .append(vec![append(
            "host-1",
            ExpectedVersion::NoStream,
            vec![event("HostAdded", json!({}))],
        )])
        .await
        .unwrap();
    read_log_through(&store, Cursor::START, 10, first.cursor).await;
    assert_eq!(store.head().await.unwrap(), first.cursor);

    let result = store
        .append(vec![
            append("vm-1", ExpectedVersion::NoStream, vec![event("VmScheduled", json!({}))]),
            append("host-1", ExpectedVersion::Exact(5), vec![event("CapacityReserved", json!({}))]),
            append("vm-2", ExpectedVersion::Any, vec![event("VmScheduled", json!({}))]),
        ])
        .await;
    match result {
        Err(StoreError::WrongExpectedVersion { stream, expected, actual }) => {
            assert_eq!(stream.as_str(), "host-1");
            assert_eq!(expected, ExpectedVersion::Exact(5));
            assert_eq!(actual, 1);
        }
        other => panic!("expected WrongExpectedVersion, got {other:?}"),
    }
    assert!(read_whole_stream(&store, &stream("vm-1"), 10).await.is_empty());
    assert!(read_whole_stream(&store, &stream("vm-2"), 10).await.is_empty());
    assert_eq!(read_whole_stream(&store, &stream("host-1"), 10).await.len(), 1);
    assert_eq!(store.head().await.unwrap(), first.cursor, "the log did not grow");
}

#[tokio::test]
async fn a_multi_stream_append_commits_every_stream_at_one_cursor() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let outcome = store
        .append(vec![
            append("vm-1", ExpectedVersion::NoStream, vec![event("VmScheduled", json!({}))]),
            append(
                "host-1",
                ExpectedVersion::Any,
                vec![event("A", json!(1)), event("B", json!(2))],
            ),
        ])
        .await
        .unwrap();
    assert_eq!(outcome.stream_versions, vec![(stream("vm-1"), 1), (stream("host-1"), 2)]);
    let events = read_log_through(&store, Cursor::START, 10, outcome.cursor).await;
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.cursor.tx_id == outcome.cursor.tx_id));
    assert_eq!(events.last().unwrap().cursor, outcome.cursor);
    // Caller order is kept in the log: vm-1's event first.
    assert_eq!(events[0].stream_id.as_str(), "vm-1");
}

#[tokio::test]
async fn a_stream_of_another_tenant_is_refused() {
    let db = TestDb::migrated().await;
    let store = db.store();
    store
        .append(vec![append("lease-9", ExpectedVersion::NoStream, vec![event("A", json!({}))])])
        .await
        .unwrap();
    let mut foreign: StreamAppend =
        append("lease-9", ExpectedVersion::Any, vec![event("B", json!({}))]);
    foreign.tenant_id = TenantId::parse("intruder").unwrap();
    let result = store.append(vec![foreign]).await;
    assert!(matches!(result, Err(StoreError::StreamOwnership { .. })), "{result:?}");
    assert_eq!(read_whole_stream(&store, &stream("lease-9"), 10).await.len(), 1);
}
