//! (d) Gap safety: an event whose transaction commits late is delivered, in order, before
//! anything that committed after it took its position; nothing is skipped.

use std::time::Duration;

use leasehold_domain::{Cursor, EventStore, ExpectedVersion, RecordedEvent};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event};

const LATER_WRITERS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_holds_back_later_events_and_is_never_skipped() {
    let db = TestDb::migrated().await;
    let store = db.store();

    // The early writer takes its position (and transaction id) first and holds its
    // transaction open on its own connection.
    let mut early_connection = store.pool().get().await.unwrap();
    let early_tx = early_connection.transaction().await.unwrap();
    let early_event = event("Early", json!({"who": "early"}));
    let early_id = early_event.event_id;
    let early = store
        .append_in(&early_tx, &[append("early", ExpectedVersion::NoStream, vec![early_event])])
        .await
        .unwrap();

    // Later writers on other connections commit while the early one is still open.
    let later = futures_util::future::join_all((0..LATER_WRITERS).map(|i| {
        let store = store.clone();
        async move {
            let payload = json!({"who": i});
            let stream = format!("later-{i}");
            store
                .append(vec![append(
                    &stream,
                    ExpectedVersion::NoStream,
                    vec![event("Later", payload)],
                )])
                .await
                .unwrap()
        }
    }))
    .await;
    for outcome in &later {
        assert!(outcome.cursor.position > early.cursor.position, "positions were taken later");
        assert!(outcome.cursor > early.cursor, "and sort after the early event");
    }

    // A whole-log reader sees none of the committed later events yet: delivering them now
    // would let a checkpoint pass the early event's position and skip it forever.
    let held_back = store.read_log(Cursor::START, 100).await.unwrap();
    assert!(held_back.events.is_empty(), "delivered {:?}", held_back.events);
    assert_eq!(held_back.next, Cursor::START);

    // A tailing reader is running when the early writer commits.
    let tail = tokio::spawn({
        let store = store.clone();
        async move { tail_until(&store, LATER_WRITERS + 1).await }
    });
    early_tx.commit().await.unwrap();
    store.notify_appended();
    let delivered = tokio::time::timeout(Duration::from_secs(30), tail).await.unwrap().unwrap();

    assert_eq!(delivered.len(), LATER_WRITERS + 1);
    assert_eq!(delivered[0].event_id, early_id, "the early event comes first");
    assert_eq!(delivered[0].cursor, early.cursor);
    let mut later_cursors: Vec<Cursor> = later.iter().map(|o| o.cursor).collect();
    later_cursors.sort();
    let delivered_later: Vec<Cursor> = delivered[1..].iter().map(|e| e.cursor).collect();
    assert_eq!(delivered_later, later_cursors, "every later event once, in cursor order");
}

/// Reads the log from the start until `count` events have arrived.
async fn tail_until(store: &leasehold_adapters::PgEventStore, count: usize) -> Vec<RecordedEvent> {
    let mut delivered = Vec::new();
    let mut cursor = Cursor::START;
    while delivered.len() < count {
        let page = store.wait_for_log(cursor, 100, Duration::from_secs(20)).await.unwrap();
        assert!(!page.events.is_empty(), "the tail saw nothing for 20 s");
        cursor = page.next;
        delivered.extend(page.events);
    }
    delivered
}
