//! (a) Concurrent writers on one stream with exact expected versions.

use std::collections::HashSet;
use std::sync::Arc;

use leasehold_adapters::StoreConfig;
use leasehold_domain::{EventStore, ExpectedVersion, StoreError};
use leasehold_tests::TestDb;
use serde_json::json;
use tokio::sync::Barrier;

use crate::support::{append, event, read_whole_stream, stream};

const WRITERS: usize = 32;
const EVENTS_PER_WRITER: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_writers_each_version_written_once_losers_told_why() {
    let db = TestDb::migrated().await;
    let store =
        Arc::new(db.store_with(StoreConfig { pool_size: WRITERS + 2, ..Default::default() }));
    // Warm every connection so the race starts at the barrier, not at connection set-up.
    let warm: Vec<_> =
        futures_util::future::join_all((0..WRITERS).map(|_| store.pool().get())).await;
    drop(warm);
    let barrier = Arc::new(Barrier::new(WRITERS));
    let writers = (0..WRITERS).map(|writer| {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move { write_all(&*store, &barrier, writer).await })
    });
    let results: Vec<(u64, bool)> =
        futures_util::future::join_all(writers).await.into_iter().map(Result::unwrap).collect();

    // Every writer saw the stream missing; exactly one of the first appends won.
    let first_round_winners = results.iter().filter(|(_, won_first)| *won_first).count();
    assert_eq!(first_round_winners, 1);
    let conflicts: u64 = results.iter().map(|(conflicts, _)| conflicts).sum();
    assert!(conflicts >= (WRITERS as u64) - 1, "only {conflicts} conflicts");

    let events = read_whole_stream(&*store, &stream("contended"), 50).await;
    let total = WRITERS as u64 * EVENTS_PER_WRITER;
    let versions: Vec<u64> = events.iter().map(|e| e.version).collect();
    assert_eq!(versions, (1..=total).collect::<Vec<_>>(), "versions are contiguous, once each");
    let written: HashSet<(u64, u64)> = events
        .iter()
        .map(|e| (e.payload["writer"].as_u64().unwrap(), e.payload["seq"].as_u64().unwrap()))
        .collect();
    assert_eq!(written.len() as u64, total, "no event lost, none written twice");
}

/// Appends this writer's events one at a time with `Exact` versions, reloading after each
/// conflict. Returns the number of conflicts and whether its first append won.
async fn write_all(store: &impl EventStore, barrier: &Barrier, writer: usize) -> (u64, bool) {
    let mut conflicts = 0;
    let mut expected = ExpectedVersion::NoStream;
    let mut won_first = None;
    barrier.wait().await;
    for seq in 0..EVENTS_PER_WRITER {
        loop {
            let payload = json!({"writer": writer, "seq": seq});
            let result = store
                .append(vec![append("contended", expected, vec![event("Written", payload)])])
                .await;
            won_first.get_or_insert(result.is_ok());
            match result {
                Ok(outcome) => {
                    assert!(!outcome.duplicate);
                    expected = ExpectedVersion::Exact(outcome.stream_versions[0].1);
                    break;
                }
                Err(StoreError::WrongExpectedVersion { stream, expected: told, actual }) => {
                    assert_eq!(stream.as_str(), "contended");
                    assert_eq!(told, expected);
                    assert_ne!(told.required(), Some(actual));
                    conflicts += 1;
                    expected = ExpectedVersion::Exact(actual);
                }
                Err(other) => panic!("writer {writer}: unexpected error {other}"),
            }
        }
    }
    (conflicts, won_first.unwrap_or(false))
}
