//! Seals: a digest over the committed order, written by one sealer at a time, that `verify`
//! holds the log to. Tampering that leaves every stream's chain intact (a stream deleted from
//! both tables, events moved in the log's order) is found at its position.

use leasehold_adapters::PgEventStore;
use leasehold_adapters::chain::{GENESIS_HASH, seal_digest};
use leasehold_adapters::verify::{BreakKind, VerifyReport};
use leasehold_domain::{Cursor, EventStore, ExpectedVersion};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_log_through, read_whole_stream, stream};

/// Streams s1..s4 of 3 events each, one transaction per stream: 12 events. Returns once a
/// sealer can see them all (a transaction open anywhere on the server holds the horizon back).
async fn four_streams(store: &PgEventStore) {
    let mut last = Cursor::START;
    for name in ["s1", "s2", "s3", "s4"] {
        let events = (0..3).map(|n| event("Charged", json!({ "n": n }))).collect();
        let appended = store.append(vec![append(name, ExpectedVersion::NoStream, events)]);
        last = appended.await.unwrap().cursor;
    }
    read_log_through(store, Cursor::START, 100, last).await;
}

async fn verified(db: &TestDb) -> VerifyReport {
    db.store().verify_log(|_| {}).await.unwrap()
}

#[tokio::test]
async fn seals_cover_the_committed_order_and_chain_from_each_other() {
    let db = TestDb::migrated().await;
    let store = db.store();
    four_streams(&store).await;
    // Whole seals of 5 events only: 12 events make two, and 2 wait for the next ones.
    assert_eq!(store.seal_all(5, false).await.unwrap(), 2);
    assert_eq!(store.seal_all(5, false).await.unwrap(), 0);
    let report = verified(&db).await;
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
    assert_eq!((report.seals_checked, report.unsealed_events), (2, 2));
    // At shutdown the rest is sealed too.
    let last = store.seal_next(5, true).await.unwrap().expect("a partial seal");
    assert_eq!((last.seal_no, last.events), (3, 2));
    let report = verified(&db).await;
    assert_eq!((report.seals_checked, report.unsealed_events), (3, 0));

    // Each digest is sha256(previous digest || the hashes in log order), recomputable from the
    // events alone.
    let client = db.client().await;
    let rows = client
        .query("SELECT hash FROM events ORDER BY log_epoch, tx_id, position", &[])
        .await
        .unwrap();
    let hashes: Vec<u8> = rows.iter().flat_map(|row| row.get::<_, Vec<u8>>(0)).collect();
    let mut digest = GENESIS_HASH;
    for covered in [&hashes[..5 * 32], &hashes[5 * 32..10 * 32], &hashes[10 * 32..]] {
        digest = seal_digest(&digest, covered);
    }
    assert_eq!(last.digest, digest);
}

#[tokio::test]
async fn a_stream_deleted_from_both_tables_is_found_missing_at_its_first_position() {
    let db = TestDb::migrated().await;
    let store = db.store();
    four_streams(&store).await;
    store.seal_all(100, true).await.unwrap();
    let s2 = read_whole_stream(&store, &stream("s2"), 10).await;
    let client = db.client().await;
    client.execute("DELETE FROM events WHERE stream_id = 's2'", &[]).await.unwrap();
    client.execute("DELETE FROM streams WHERE stream_id = 's2'", &[]).await.unwrap();

    let report = verified(&db).await;
    let first = report.first_break().expect("found");
    assert_eq!(first.kind, BreakKind::SealedEventMissing);
    assert_eq!(first.position, s2[0].cursor.position);
}

#[tokio::test]
async fn events_moved_in_the_log_order_are_found_reordered() {
    let db = TestDb::migrated().await;
    let store = db.store();
    four_streams(&store).await;
    store.seal_all(100, true).await.unwrap();
    // s1's and s3's transactions trade places: each stream's chain and versions stay intact.
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TEMP TABLE tx AS SELECT stream_id, tx_id FROM events \
               WHERE stream_id IN ('s1', 's3') AND version = 1; \
             UPDATE events e SET tx_id = (SELECT tx_id FROM tx WHERE tx.stream_id <> e.stream_id) \
               WHERE stream_id IN ('s1', 's3');",
        )
        .await
        .unwrap();

    let report = verified(&db).await;
    let first = report.first_break().expect("found");
    assert_eq!(first.kind, BreakKind::Reordered, "{:?}", report.breaks);
    assert_eq!((first.stream_id.as_str(), first.version), ("s3", 1));
    assert!(report.breaks.iter().all(|found| found.kind == BreakKind::Reordered));
}

#[tokio::test]
async fn a_reorder_after_the_last_seal_is_found_by_stream_order() {
    let db = TestDb::migrated().await;
    let store = db.store();
    four_streams(&store).await;
    // Two more events of s4, in a later transaction, then s4's first event moved after them.
    let more = (0..2).map(|n| event("Charged", json!({ "n": n }))).collect();
    store.append(vec![append("s4", ExpectedVersion::Exact(3), more)]).await.unwrap();
    // (Nothing is sealed here: the order check covers the unsealed tail.)
    let client = db.client().await;
    client
        .execute(
            "UPDATE events SET tx_id = (SELECT max(tx_id) FROM events) \
             WHERE stream_id = 's4' AND version = 1",
            &[],
        )
        .await
        .unwrap();

    let report = verified(&db).await;
    assert_eq!(report.seals_checked, 0);
    let first = report.first_break().expect("found");
    assert_eq!(first.kind, BreakKind::Reordered, "{:?}", report.breaks);
    assert_eq!(first.stream_id, "s4");
}

#[tokio::test]
async fn an_altered_seal_is_a_seal_mismatch() {
    let db = TestDb::migrated().await;
    let store = db.store();
    four_streams(&store).await;
    assert_eq!(store.seal_all(4, false).await.unwrap(), 3);
    let client = db.client().await;
    let altered = client
        .execute("UPDATE ledger_seals SET digest = sha256(digest) WHERE seal_no = 2", &[])
        .await
        .unwrap();
    assert_eq!(altered, 1);

    let report = verified(&db).await;
    assert_eq!(report.seals_checked, 3);
    let kinds: Vec<_> = report.breaks.iter().map(|found| found.kind.clone()).collect();
    // Seal 2's digest is wrong, and seal 3 no longer chains from it.
    assert_eq!(
        kinds,
        [BreakKind::SealMismatch { seal_no: 2 }, BreakKind::SealMismatch { seal_no: 3 }]
    );
}

/// Two sealers at once (two processes' stores) while writers append: the seals are
/// contiguous, every event is in exactly one, and the log verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sealers_write_one_chain_of_seals_while_appends_go_on() {
    let db = TestDb::migrated().await;
    let (first, second) = (db.store(), db.store());
    let writer = {
        let store = db.store();
        tokio::spawn(async move {
            let mut last = Cursor::START;
            for n in 0..200 {
                let events = vec![event("Charged", json!({ "n": n }))];
                let name = format!("w{n}");
                let appended = store.append(vec![append(&name, ExpectedVersion::NoStream, events)]);
                last = appended.await.unwrap().cursor;
            }
            last
        })
    };
    let sealer = |store: leasehold_adapters::PgEventStore| {
        tokio::spawn(async move {
            let mut written = 0;
            for _ in 0..50 {
                written += store.seal_all(7, false).await.unwrap();
                tokio::task::yield_now().await;
            }
            written
        })
    };
    let (a, b) = (sealer(first), sealer(second));
    let last = writer.await.unwrap();
    let written = a.await.unwrap() + b.await.unwrap();
    let store = db.store();
    read_log_through(&store, Cursor::START, 1_000, last).await;
    let rest = store.seal_all(7, true).await.unwrap();

    let client = db.client().await;
    let row = client
        .query_one("SELECT count(*), sum(events)::bigint, max(seal_no) FROM ledger_seals", &[])
        .await
        .unwrap();
    let (seals, sealed, last): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(u64::try_from(seals).unwrap(), written + rest);
    assert_eq!(last, seals, "seal numbers are contiguous");
    assert_eq!(sealed, 200, "every event is in exactly one seal");
    let report = verified(&db).await;
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
    assert_eq!((report.unsealed_events, report.events_checked), (0, 200));
}
