//! (e) The whole-log order is stable and agrees with every stream's version order, under
//! concurrent multi-stream appends.

use std::collections::HashMap;

use leasehold_domain::{Cursor, EventStore, ExpectedVersion};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_log_through};

const TASKS: u64 = 8;
const APPENDS_PER_TASK: u64 = 25;
const STREAMS: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_log_order_is_repeatable_and_follows_stream_versions() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let tasks = (0..TASKS).map(|task| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut last = Cursor::START;
            for n in 0..APPENDS_PER_TASK {
                // Two different streams per append, in a task-dependent order, so that
                // appends contend on overlapping stream sets.
                let a = (task + n) % STREAMS;
                let b = (a + 1 + (task * 7 + n) % (STREAMS - 1)) % STREAMS;
                let payload = json!({"task": task, "n": n});
                let outcome = store
                    .append(vec![
                        append(
                            &format!("s{a}"),
                            ExpectedVersion::Any,
                            vec![event("E", payload.clone())],
                        ),
                        append(&format!("s{b}"), ExpectedVersion::Any, vec![event("E", payload)]),
                    ])
                    .await
                    .unwrap();
                last = last.max(outcome.cursor);
            }
            last
        })
    });
    let mut through = Cursor::START;
    for task in futures_util::future::join_all(tasks).await {
        through = through.max(task.unwrap());
    }

    let first = read_log_through(&store, Cursor::START, 7, through).await;
    let second = read_log_through(&store, Cursor::START, 1000, through).await;
    assert_eq!(first.len() as u64, TASKS * APPENDS_PER_TASK * 2);
    assert_eq!(first, second, "two reads of the log agree, whatever the page size");
    assert!(first.windows(2).all(|w| w[0].cursor < w[1].cursor), "cursors strictly increase");

    let mut last_version: HashMap<String, u64> = HashMap::new();
    for event in &first {
        let last = last_version.entry(event.stream_id.to_string()).or_insert(0);
        assert_eq!(event.version, *last + 1, "stream {} out of version order", event.stream_id);
        *last = event.version;
    }
}
