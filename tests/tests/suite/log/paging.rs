//! (g) Paging through 100,000 events, by stream and by cursor, returns each exactly once.

use std::collections::HashSet;
use std::ops::ControlFlow;

use leasehold_domain::{Cursor, EventId, EventStore, ExpectedVersion};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_log_through, read_whole_stream, stream};

const STREAMS: usize = 1_000;
const EVENTS_PER_STREAM: usize = 100;
const STREAMS_PER_APPEND: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_thousand_events_page_out_exactly_once() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let mut written: HashSet<EventId> = HashSet::new();
    let mut appends = Vec::new();
    for first in (0..STREAMS).step_by(STREAMS_PER_APPEND) {
        let batch: Vec<_> = (first..first + STREAMS_PER_APPEND)
            .map(|s| {
                let events: Vec<_> = (0..EVENTS_PER_STREAM)
                    .map(|n| event("Paged", json!({"s": s, "n": n})))
                    .collect();
                written.extend(events.iter().map(|e| e.event_id));
                append(&format!("p-{s}"), ExpectedVersion::NoStream, events)
            })
            .collect();
        appends.push(batch);
    }
    // Four writers at a time.
    let mut through = Cursor::START;
    for chunk in appends.chunks(4) {
        let writes = chunk.iter().cloned().map(|batch| {
            let store = store.clone();
            async move { store.append(batch).await.unwrap() }
        });
        for outcome in futures_util::future::join_all(writes).await {
            through = through.max(outcome.cursor);
        }
    }
    assert_eq!(written.len(), STREAMS * EVENTS_PER_STREAM);

    let by_cursor = read_log_through(&store, Cursor::START, 997, through).await;
    assert_eq!(by_cursor.len(), written.len());
    let ids: HashSet<EventId> = by_cursor.iter().map(|e| e.event_id).collect();
    assert_eq!(ids, written, "by cursor: each event exactly once");

    // The pipelined catch-up reader delivers the same pages in the same order.
    let mut caught_up = Vec::new();
    let last = store
        .catch_up(Cursor::START, 997, |page| {
            caught_up.extend(page.events);
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(last, through);
    assert!(caught_up == by_cursor, "catch-up and paged reads differ");
    let mut pages = 0;
    let stopped = store
        .catch_up(Cursor::START, 997, |_| {
            pages += 1;
            ControlFlow::Break(())
        })
        .await
        .unwrap();
    assert_eq!((pages, stopped), (1, by_cursor[996].cursor));

    let mut by_stream = HashSet::new();
    for s in 0..STREAMS {
        let events = read_whole_stream(&store, &stream(&format!("p-{s}")), 33).await;
        let versions: Vec<u64> = events.iter().map(|e| e.version).collect();
        assert_eq!(versions, (1..=EVENTS_PER_STREAM as u64).collect::<Vec<_>>());
        for e in events {
            assert!(by_stream.insert(e.event_id), "event {} read twice", e.event_id);
        }
    }
    assert_eq!(by_stream, written, "by stream: each event exactly once");
}
