//! Group commit: concurrent appends share transactions, yet each stays atomic on its own: a
//! refused append or a retried one in the same group changes nothing for its neighbours.

use std::collections::HashSet;

use leasehold_domain::{AppendOutcome, EventStore, ExpectedVersion, StoreError};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_whole_stream, stream, until_waiting_for_a_lock};

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
    let report = store.verify_log(|_| {}).await.unwrap();
    assert_eq!(report.events_checked, (GOOD + RESENT) as u64);
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
}

/// Polls `future` once: whether it finished, without giving it up.
async fn poll_once<F: std::future::Future + Unpin>(future: &mut F) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx)))
        .await
}

/// Holds the row lock of `stream_id`'s stream in a transaction of its own (no idle timeout).
async fn hold_stream(db: &TestDb, stream_id: &str) -> tokio_postgres::Client {
    let holder = db.client().await;
    holder
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = 0; BEGIN; \
             SELECT 1 FROM streams WHERE stream_id = '{stream_id}' FOR UPDATE"
        ))
        .await
        .expect("the stream row is locked");
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_member_is_answered_while_a_neighbour_retried_alone_still_waits() {
    let db = TestDb::migrated().await;
    // Streams this store has never seen (another process wrote them), so appends to them are
    // retried alone, after the group.
    let other = db.store();
    for id in ["locked", "gate"] {
        let first = append(id, ExpectedVersion::NoStream, vec![event("E", json!(0))]);
        other.append(vec![first]).await.expect("written");
    }
    let store =
        db.store_with(leasehold_adapters::StoreConfig { committers: 1, ..Default::default() });
    let locked = hold_stream(&db, "locked").await;
    let gate = hold_stream(&db, "gate").await;
    // The one committer is busy with an append waiting for the gate...
    let next = |id: &str| append(id, ExpectedVersion::Exact(1), vec![event("E", json!(1))]);
    let gated = {
        let store = store.clone();
        let append = next("gate");
        tokio::spawn(async move { store.append(vec![append]).await })
    };
    until_waiting_for_a_lock(&db.client().await, None).await;
    // ...while the next group queues: an append to the locked stream and two new streams.
    let new = |id: &str| append(id, ExpectedVersion::NoStream, vec![event("E", json!(0))]);
    let mut slow = Box::pin(store.append(vec![next("locked")]));
    let mut fast_1 = Box::pin(store.append(vec![new("fast-1")]));
    let mut fast_2 = Box::pin(store.append(vec![new("fast-2")]));
    for queued in [&mut slow, &mut fast_1, &mut fast_2] {
        assert!(poll_once(queued).await.is_pending(), "queued for the next group");
    }
    gate.batch_execute("ROLLBACK").await.expect("the gate opens");
    gated.await.expect("the task").expect("the gated append commits");
    // The two new streams commit in the group and are answered while the other member, retried
    // on its own, still waits for the lock.
    let answered = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        futures_util::future::join(&mut fast_1, &mut fast_2).await
    });
    let (one, two) = answered.await.expect("answered while the neighbour waits");
    assert!(one.is_ok() && two.is_ok(), "{one:?} {two:?}");
    assert!(poll_once(&mut slow).await.is_pending(), "the neighbour still waits for the lock");
    locked.batch_execute("ROLLBACK").await.expect("released");
    let done = tokio::time::timeout(std::time::Duration::from_secs(60), slow).await;
    assert_eq!(done.expect("in time").expect("appended").stream_versions[0].1, 2);
}
