//! The idempotency ledger: a retry gets the recorded outcome, a reused key with another
//! request is refused, and neither appends anything.

use leasehold_commands::{CommandError, ErrorClass};
use leasehold_domain::lease::{LeaseCommand, LeaseFacts};
use leasehold_tests::TestDb;

use super::support::*;

#[tokio::test]
async fn the_same_key_and_request_twice_appends_once_and_answers_duplicate() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = new_lease();
    let first = pipeline
        .execute(request("acme", lease, "op-1", provision(lease, 1), routed()))
        .await
        .expect("accepted");
    assert!(!first.duplicate);
    assert_eq!(first.event_types, ["LeaseProvisionRequested"]);
    // Another process (no shared memory) retries.
    let second = super::support::pipeline(&db)
        .execute(request("acme", lease, "op-1", provision(lease, 1), routed()))
        .await
        .expect("a retry succeeds");
    assert!(second.duplicate);
    assert_eq!(
        (second.version, second.cursor, &second.event_types),
        (first.version, first.cursor, &first.event_types)
    );
    assert_eq!(types_of(&db, lease).await, ["LeaseProvisionRequested"]);
}

#[tokio::test]
async fn the_same_key_with_another_request_is_an_idempotency_conflict() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = new_lease();
    pipeline
        .execute(request("acme", lease, "op-1", provision(lease, 1), routed()))
        .await
        .expect("accepted");
    let reused =
        pipeline.execute(request("acme", lease, "op-1", provision(lease, 2), routed())).await;
    let error = reused.expect_err("refused");
    assert!(matches!(error, CommandError::IdempotencyConflict), "{error:?}");
    assert_eq!(error.class(), ErrorClass::IdempotencyConflict);
    // On another lease, too: the key is the tenant's, not the stream's.
    let other = new_lease();
    let reused =
        pipeline.execute(request("acme", other, "op-1", provision(other, 1), routed())).await;
    assert!(matches!(reused, Err(CommandError::IdempotencyConflict)));
    assert_eq!(types_of(&db, lease).await, ["LeaseProvisionRequested"]);
    assert!(types_of(&db, other).await.is_empty());
    // Another tenant's keys are its own.
    pipeline
        .execute(request("globex", other, "op-1", provision(other, 1), routed()))
        .await
        .expect("accepted");
}

#[tokio::test]
async fn a_retry_gets_its_outcome_even_after_the_state_moved_on() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = new_lease();
    let first = pipeline
        .execute(request("acme", lease, "op-1", provision(lease, 1), routed()))
        .await
        .expect("accepted");
    pipeline
        .execute(request("acme", lease, "op-2", provisioned(lease), LeaseFacts::default()))
        .await
        .expect("ready");
    // Deciding the request again would now be refused (the lease is ready); the ledger answers.
    let retry = pipeline
        .execute(request("acme", lease, "op-1", provision(lease, 1), routed()))
        .await
        .expect("a retry succeeds");
    assert!(retry.duplicate);
    assert_eq!((retry.version, retry.cursor), (first.version, first.cursor));
    // The same request under a new key is refused by the state guard.
    let fresh =
        pipeline.execute(request("acme", lease, "op-3", provision(lease, 1), routed())).await;
    assert_eq!(fresh.expect_err("refused").class(), ErrorClass::InvalidState);
}

#[tokio::test]
async fn a_command_that_changes_nothing_is_recorded_too() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline(&db);
    let lease = ready_lease(&pipeline, "acme").await;
    let deprovision = || LeaseCommand::Deprovision;
    let first = pipeline
        .execute(request("acme", lease, "down-1", deprovision(), LeaseFacts::default()))
        .await
        .expect("accepted");
    assert_eq!(first.event_types, ["LeaseDeprovisionRequested", "LeaseClosed"]);
    let again = pipeline
        .execute(request("acme", lease, "down-2", deprovision(), LeaseFacts::default()))
        .await
        .expect("idempotent");
    assert!(again.event_types.is_empty() && !again.duplicate);
    assert_eq!((again.version, again.cursor), (first.version, first.cursor));
    let retry = pipeline
        .execute(request("acme", lease, "down-2", deprovision(), LeaseFacts::default()))
        .await
        .expect("a retry");
    assert!(retry.duplicate && retry.event_types.is_empty());
    assert_eq!(retry.cursor, first.cursor);
    let events = types_of(&db, lease).await.len();
    assert_eq!(events, 5, "three to make it ready, the release and its tenant's close");
}

#[tokio::test]
async fn concurrent_retries_of_one_command_append_once() {
    let db = TestDb::migrated().await;
    let lease = new_lease();
    let pipelines: Vec<_> = (0..8).map(|_| pipeline(&db)).collect();
    let outcomes =
        futures_util::future::join_all(pipelines.iter().map(|p| {
            p.execute(request("acme", lease, "op-racing", provision(lease, 1), routed()))
        }))
        .await;
    let outcomes: Vec<_> = outcomes.into_iter().map(|o| o.expect("every copy succeeds")).collect();
    assert_eq!(outcomes.iter().filter(|o| !o.duplicate).count(), 1, "exactly one copy appended");
    assert!(outcomes.iter().all(|o| o.cursor == outcomes[0].cursor && o.version == 1));
    assert_eq!(types_of(&db, lease).await, ["LeaseProvisionRequested"]);
}
