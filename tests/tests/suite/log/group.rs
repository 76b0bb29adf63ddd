//! Group commit: concurrent appends share transactions, yet each stays atomic on its own: a
//! refused append or a retried one in the same group changes nothing for its neighbours.

use std::collections::HashSet;

use leasehold_domain::{AppendOutcome, EventStore, ExpectedVersion, StoreError};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_whole_stream, stream};

const GOOD: usize = 200;
const WRONG: usize = 20;
const RESENT: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_appends_succeed_or_fail_one_by_one() {
    let db = TestDb::migrated().await;
    let store = db.store();
    // Appends that will be sent again, concurrently with everything else.
    let mut originals = Vec::new();
    for n in 0..RESENT {
        let sent =
            append(&format!("resent-{n}"), ExpectedVersion::NoStream, vec![event("E", json!(n))]);
        let outcome = store.append(vec![sent.clone()]).await.unwrap();
        originals.push((sent, outcome));
    }

    let good = (0..GOOD).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            let sent =
                append(&format!("good-{n}"), ExpectedVersion::NoStream, vec![event("E", json!(n))]);
            store.append(vec![sent]).await
        })
    });
    let wrong = (0..WRONG).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            let sent = append(
                &format!("wrong-{n}"),
                ExpectedVersion::Exact(7),
                vec![event("E", json!(n))],
            );
            store.append(vec![sent]).await
        })
    });
    let resent = originals.iter().map(|(sent, _)| {
        let (store, sent) = (store.clone(), sent.clone());
        tokio::spawn(async move { store.append(vec![sent]).await })
    });
    let good: Vec<AppendOutcome> = futures_util::future::join_all(good)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let wrong = futures_util::future::join_all(wrong).await;
    let resent = futures_util::future::join_all(resent).await;

    assert!(good.iter().all(|o| !o.duplicate && o.stream_versions[0].1 == 1));
    let transactions: HashSet<u64> = good.iter().map(|o| o.cursor.tx_id).collect();
    assert!(transactions.len() < GOOD, "no two appends shared a transaction");
    for result in wrong {
        let error = result.unwrap().unwrap_err();
        assert!(matches!(error, StoreError::WrongExpectedVersion { actual: 0, .. }), "{error:?}");
    }
    for (result, (_, original)) in resent.into_iter().zip(&originals) {
        let outcome = result.unwrap().unwrap();
        assert!(outcome.duplicate);
        assert_eq!(outcome.cursor, original.cursor);
    }
    for n in 0..WRONG {
        assert!(read_whole_stream(&store, &stream(&format!("wrong-{n}")), 10).await.is_empty());
    }
    for n in 0..RESENT {
        assert_eq!(read_whole_stream(&store, &stream(&format!("resent-{n}")), 10).await.len(), 1);
    }
    let report = store.verify_chains(|_| {}).await.unwrap();
    assert_eq!(report.events_checked, (GOOD + RESENT) as u64);
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
}
