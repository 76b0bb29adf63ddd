//! The dispatcher's outbox (`adapters::dispatch::PgOutbox`) on a real database: intake is
//! idempotent, newer work supersedes pending older work (but work beside its stream's), an attempt number is claimed before
//! a send and never reused, a claimed row is held while its send runs, a send the target refused to try gives its number back, and work
//! waits until it is due; taken work is overdue at its answer deadline until that is handled;
//! work an instance claimed and never settled is freed by the next instance at once when its
//! action's receiver refuses a repeat atomically, and work waiting out a backoff is not.

use chrono::{TimeDelta, Timelike as _, Utc};
use leasehold_adapters::dispatch::{Backoff, Intent, PgOutbox};
use leasehold_domain::{EventId, StreamId, TenantId};
use leasehold_tests::TestDb;
use uuid::Uuid;

const DISPATCHER: &str = "test-dispatcher";
/// The dispatcher instance claiming work in these tests.
const ME: Uuid = Uuid::from_u128(1);

fn intent(stream: &str, generation: u64) -> Intent {
    Intent {
        stream: StreamId::parse(stream).expect("valid"),
        generation,
        event_id: EventId::from_uuid(Uuid::now_v7()),
        tenant: TenantId::parse("acme").expect("valid"),
        target: "sim-1".into(),
        action: "provision",
        request: serde_json::json!({ "lease_uuid": Uuid::nil() }),
    }
}

#[tokio::test]
async fn attempts_are_claimed_once_given_back_when_unsent_and_wait_until_due() {
    let db = TestDb::migrated().await;
    let outbox = PgOutbox::new(db.store());
    // Whole seconds: the table keeps microseconds.
    let now = Utc::now().with_nanosecond(0).expect("valid");
    let first = intent("lease-a", 1);
    outbox.enqueue(DISPATCHER, std::slice::from_ref(&first), now).await.unwrap();
    // A replayed intake changes nothing.
    outbox.enqueue(DISPATCHER, std::slice::from_ref(&first), now).await.unwrap();
    let hold = TimeDelta::seconds(70);
    let claimed = outbox.claim_due((DISPATCHER, ME), now, 10, now + hold).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].attempt, 1);
    // Claimed and not yet answered: held while its send runs, so never sent twice at once.
    assert!(outbox.claim_due((DISPATCHER, ME), now, 10, now + hold).await.unwrap().is_empty());
    // A crash leaves it claimed and unanswered: due again once the hold runs out, under a
    // new number.
    let again = outbox.claim_due((DISPATCHER, ME), now + hold, 10, now + hold * 2).await.unwrap();
    assert_eq!(again[0].attempt, 2, "a claimed number is never handed out twice");
    let key = (&first.stream, 1);
    // Not sent (the breaker was open): the number is given back, the work waits.
    let later = now + TimeDelta::seconds(1);
    outbox.give_back(key, 2, later, "circuit open").await.unwrap();
    assert!(
        outbox.claim_due((DISPATCHER, ME), now, 10, later).await.unwrap().is_empty(),
        "not due"
    );
    assert_eq!(outbox.next_due(DISPATCHER).await.unwrap(), Some(later));
    let due = outbox.claim_due((DISPATCHER, ME), later, 10, later + hold).await.unwrap();
    assert_eq!(due[0].attempt, 2, "the given-back number is used again");
    // Failed: it keeps its number and waits for the backoff.
    let backoff = Backoff::default();
    let next = later + backoff.after(2);
    outbox.retry(key, 2, next, "connection refused").await.unwrap();
    let rows = outbox.rows(DISPATCHER).await.unwrap();
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("pending", 2));
    assert_eq!(rows[0].last_error.as_deref(), Some("connection refused"));
    assert_eq!(
        outbox.claim_due((DISPATCHER, ME), next, 10, next + hold).await.unwrap()[0].attempt,
        3
    );
    outbox.finish(key, "delivered", next).await.unwrap();
    let much_later = next + TimeDelta::hours(1);
    assert!(
        outbox.claim_due((DISPATCHER, ME), much_later, 10, much_later).await.unwrap().is_empty()
    );
    assert_eq!(outbox.next_due(DISPATCHER).await.unwrap(), None);
}

#[tokio::test]
async fn newer_work_supersedes_pending_older_work_on_its_stream_only() {
    let db = TestDb::migrated().await;
    let outbox = PgOutbox::new(db.store());
    let now = Utc::now();
    outbox.enqueue(DISPATCHER, &[intent("lease-a", 1), intent("lease-b", 1)], now).await.unwrap();
    outbox.enqueue(DISPATCHER, &[intent("lease-a", 2)], now).await.unwrap();
    let rows = outbox.rows(DISPATCHER).await.unwrap();
    let states: Vec<(&str, u64, &str)> =
        rows.iter().map(|r| (r.stream.as_str(), r.generation, r.state.as_str())).collect();
    assert_eq!(
        states,
        [("lease-a", 1, "superseded"), ("lease-a", 2, "pending"), ("lease-b", 1, "pending")]
    );
    // Within one batch too, only a stream's newest work is pending.
    outbox.enqueue(DISPATCHER, &[intent("lease-c", 1), intent("lease-c", 2)], now).await.unwrap();
    let rows = outbox.rows(DISPATCHER).await.unwrap();
    let c: Vec<(u64, &str)> = rows
        .iter()
        .filter(|r| r.stream == "lease-c")
        .map(|r| (r.generation, r.state.as_str()))
        .collect();
    assert_eq!(c, [(1, "superseded"), (2, "pending")]);
    // Another dispatcher's work is its own.
    assert!(outbox.claim_due(("another", ME), now, 10, now).await.unwrap().is_empty());
}

#[tokio::test]
async fn work_beside_its_stream_supersedes_nothing_and_nothing_supersedes_it() {
    let db = TestDb::migrated().await;
    let outbox = PgOutbox::new(db.store());
    let now = Utc::now();
    let of = |generation, action| Intent { action, ..intent("snapshot-a", generation) };
    let beside: &[&str] = &["export"];
    // A pending create; an export beside it; a restore (supersedes the create only); a second
    // export in the same batch as a later deletion.
    outbox
        .enqueue_beside(DISPATCHER, (&[of(1, "create"), of(2, "export")], beside), now)
        .await
        .unwrap();
    outbox.enqueue_beside(DISPATCHER, (&[of(3, "restore")], beside), now).await.unwrap();
    outbox
        .enqueue_beside(DISPATCHER, (&[of(4, "export"), of(5, "delete")], beside), now)
        .await
        .unwrap();
    let rows = outbox.rows(DISPATCHER).await.unwrap();
    let states: Vec<(u64, &str)> = rows.iter().map(|r| (r.generation, r.state.as_str())).collect();
    assert_eq!(
        states,
        [(1, "superseded"), (2, "pending"), (3, "superseded"), (4, "pending"), (5, "pending")]
    );
}

#[tokio::test]
async fn taken_work_is_overdue_at_its_deadline_until_its_deadline_is_handled() {
    let db = TestDb::migrated().await;
    let outbox = PgOutbox::new(db.store());
    let now = Utc::now().with_nanosecond(0).expect("valid");
    let (awaited, released) = (intent("lease-a", 1), intent("lease-b", 1));
    outbox.enqueue(DISPATCHER, &[awaited.clone(), released.clone()], now).await.unwrap();
    outbox.claim_due((DISPATCHER, ME), now, 10, now + TimeDelta::seconds(70)).await.unwrap();
    let deadline = now + TimeDelta::seconds(600);
    outbox.deliver((&awaited.stream, 1), now, Some(deadline)).await.unwrap();
    // Work settled without a callback (a release) has no deadline.
    outbox.deliver((&released.stream, 1), now, None).await.unwrap();
    assert_eq!(outbox.next_due(DISPATCHER).await.unwrap(), Some(deadline), "woken at it");
    let before = deadline - TimeDelta::seconds(1);
    assert!(outbox.overdue(DISPATCHER, before, 10).await.unwrap().is_empty());
    let overdue = outbox.overdue(DISPATCHER, deadline, 10).await.unwrap();
    assert_eq!(overdue.len(), 1);
    assert_eq!((overdue[0].stream.as_str(), overdue[0].attempt), ("lease-a", 1));
    // Handled: lapsed, it is never overdue again; nothing else is due.
    outbox.lapse((&awaited.stream, 1), true).await.unwrap();
    let later = deadline + TimeDelta::hours(1);
    assert!(outbox.overdue(DISPATCHER, later, 10).await.unwrap().is_empty());
    assert_eq!(outbox.next_due(DISPATCHER).await.unwrap(), None);
    let states: Vec<String> =
        outbox.rows(DISPATCHER).await.unwrap().into_iter().map(|r| r.state).collect();
    assert_eq!(states, ["lapsed", "delivered"]);
}

#[test]
fn backoff_doubles_up_to_its_maximum() {
    let backoff = Backoff::default();
    let waits: Vec<i64> = (1..=9).map(|n| backoff.after(n).num_milliseconds()).collect();
    assert_eq!(waits, [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]);
}

#[tokio::test]
async fn claims_an_earlier_instance_left_are_freed_at_once_for_safe_actions_only() {
    let db = TestDb::migrated().await;
    let outbox = PgOutbox::new(db.store());
    let now = Utc::now().with_nanosecond(0).expect("valid");
    let (gone, next) = (Uuid::from_u128(2), Uuid::from_u128(3));
    let (sending, waiting) = (intent("lease-a", 1), intent("lease-b", 1));
    let mut restarting = intent("lease-c", 1);
    restarting.action = "restart";
    let work = [sending.clone(), waiting.clone(), restarting.clone()];
    outbox.enqueue(DISPATCHER, &work, now).await.unwrap();
    let hold = now + TimeDelta::minutes(10);
    assert_eq!(outbox.claim_due((DISPATCHER, gone), now, 10, hold).await.unwrap().len(), 3);
    // One send failed and waits for its backoff; the others were in flight when their
    // instance died.
    let backoff = now + TimeDelta::seconds(30);
    outbox.retry((&waiting.stream, 1), 1, backoff, "connection refused").await.unwrap();
    let safe = ["provision"];
    // The instance itself frees nothing of its own, nor does another dispatcher's.
    assert_eq!(outbox.free_claims_of_others((DISPATCHER, gone), &safe, now).await.unwrap(), 0);
    let another = ("another", next);
    assert_eq!(outbox.free_claims_of_others(another, &safe, now).await.unwrap(), 0);
    // The next instance frees the provision in flight; not the backoff, and not the
    // restart, whose repeat the receiver would not refuse (it waits out its hold).
    assert_eq!(outbox.free_claims_of_others((DISPATCHER, next), &safe, now).await.unwrap(), 1);
    let later_hold = hold + TimeDelta::minutes(10);
    let due = outbox.claim_due((DISPATCHER, next), now, 10, later_hold).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!((&due[0].stream, due[0].attempt), (&sending.stream, 2), "a new number");
    assert_eq!(outbox.next_due(DISPATCHER).await.unwrap(), Some(backoff));
    let after_hold = outbox.claim_due((DISPATCHER, next), hold, 10, later_hold);
    let after_hold = after_hold.await.unwrap();
    let streams: Vec<_> = after_hold.iter().map(|work| work.stream.as_str()).collect();
    assert_eq!(streams, ["lease-b", "lease-c"], "the rest after the backoff and the hold");
}
