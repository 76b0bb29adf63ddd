//! A node's enrollment token is single-use, time-bounded and valid only for its node, rental
//! and generation: every misuse is refused with nothing appended and no token text anywhere
//! in the log. A re-enrollment raises the fencing token, so a partitioned node still holding
//! the old session is `FENCED` with no event, and so is a launch decided under the old token.

use chrono::TimeDelta;
use leasehold_commands::enrollment::node_of;
use leasehold_commands::node_service::Presented;
use leasehold_commands::{CommandError, ErrorClass};
use leasehold_domain::RefusalKind;
use leasehold_domain::node::{NodeError, OperationResult};
use leasehold_domain::run::{WorkloadObservation, WorkloadPhase};
use leasehold_domain::values::OperationId;
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;
use uuid::Uuid;

use super::support::*;

async fn misuse(
    services: &Services,
    node: leasehold_domain::node::NodeId,
    presented: Presented<'_>,
) -> Result<leasehold_commands::node_service::Enrollment, CommandError<NodeError>> {
    services.nodes.enroll(node, presented, (agent_version(), facts())).await
}

#[tokio::test]
async fn an_enrollment_token_used_twice_expired_or_for_another_identity_is_refused() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    let other = active_rental(&services, "acme", "r2").await;
    let node = node_of(rental, 1);
    let token = key().enrollment_token(node);
    let before = log_len(&db).await;
    let refusals = [
        // Another node's token, and this token for another rental, generation or node.
        misuse(
            &services,
            node,
            Presented::Token {
                token: &key().enrollment_token(node_of(other, 1)),
                rental,
                generation: 1,
            },
        )
        .await,
        misuse(&services, node, Presented::Token { token: &token, rental: other, generation: 1 })
            .await,
        misuse(&services, node, Presented::Token { token: &token, rental, generation: 2 }).await,
        misuse(
            &services,
            node_of(other, 1),
            Presented::Token { token: &token, rental: other, generation: 1 },
        )
        .await,
        misuse(&services, node, Presented::Token { token: "not-a-token", rental, generation: 1 })
            .await,
    ];
    for refused in refusals {
        assert!(
            matches!(refused, Err(CommandError::Refused(NodeError::EnrollmentRefused))),
            "{refused:?}"
        );
    }
    assert_eq!(log_len(&db).await, before, "nothing appended");
    let first = enroll(&services, rental).await;
    assert_eq!(first.fencing_token, 1);
    let enrolled = log_len(&db).await;
    let again =
        misuse(&services, node, Presented::Token { token: &token, rental, generation: 1 }).await;
    assert!(
        matches!(again, Err(CommandError::Refused(NodeError::EnrollmentRefused))),
        "used twice"
    );
    // Expired: the other rental's token, 30 minutes after its invite.
    clock.advance(TimeDelta::minutes(30));
    let late = key().enrollment_token(node_of(other, 1));
    let expired = misuse(
        &services,
        node_of(other, 1),
        Presented::Token { token: &late, rental: other, generation: 1 },
    )
    .await;
    assert!(matches!(expired, Err(CommandError::Refused(NodeError::EnrollmentRefused))), "expired");
    assert_eq!(
        expired.expect_err("refused").class(),
        ErrorClass::NotFound,
        "one refusal that confirms nothing"
    );
    assert_eq!(log_len(&db).await, enrolled, "neither the reuse nor the late token appended");
    let log = whole_log_text(&db).await;
    for secret in [token.as_str(), late.as_str(), first.credential.as_str()] {
        assert!(!log.contains(secret), "a token or credential in the log");
    }
}

#[tokio::test]
async fn a_partitioned_node_with_the_old_fencing_token_is_fenced_after_a_re_enrollment() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    let old = enroll(&services, rental).await;
    let old_session = session_of(&services, &old);
    // The node comes back on another connection and enrolls again with its credential.
    let node = node1(rental);
    let resumed = services
        .nodes
        .enroll(node, Presented::Credential(&old.credential), (agent_version(), facts()))
        .await
        .expect("resumed");
    assert_eq!((resumed.fencing_token, resumed.duplicate), (2, true));
    let stream = node.stream_id();
    let before = events_of(&db, &stream).await.len();
    let heartbeat = services.nodes.heartbeat(&old_session, "old-beat", None).await;
    let settle = services
        .nodes
        .settle(
            &old_session,
            "old-settle",
            (OperationId(Uuid::from_u128(1)), OperationResult::Applied),
        )
        .await;
    let look = WorkloadObservation {
        run: leasehold_domain::run::RunId(Uuid::from_u128(2)),
        attempt: leasehold_domain::run::AttemptId(Uuid::from_u128(3)),
        phase: WorkloadPhase::Running,
        observed_at: start(),
        started_at: None,
        finished_at: None,
        exit_code: None,
        oom_killed: false,
    };
    let observe = services.nodes.observe(&old_session, "old-look", look).await;
    for refused in [heartbeat, settle, observe] {
        let error = refused.expect_err("fenced");
        assert_eq!(error.class(), ErrorClass::Fenced, "{error:?}");
    }
    assert_eq!(events_of(&db, &stream).await.len(), before, "no event");
    // A launch decided under the old token (before the re-enrollment) is fenced too, with
    // nothing of it on the run either.
    let run = super::runs::booked_run(&services, rental, "run-1").await;
    let booked = log_len(&db).await;
    let launch =
        super::runs::create_attempt_under(&services, run, rental, old_session.fencing_token).await;
    assert_eq!(log_len(&db).await, booked, "the stale launch appended nothing");
    match launch {
        Err(CommandError::LinkedRefused { kind, .. }) => assert_eq!(kind, RefusalKind::Fenced),
        other => panic!("expected a fenced launch, got {other:?}"),
    }
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert!(stored.attempts.is_empty(), "no attempt recorded under a stale token");
}

/// An enrollment again is answered with its session even when orders to the node are appended
/// right after it (under the token it raised): only a later enrollment closes a session, not
/// any later event of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enrollment_followed_at_once_by_orders_to_its_node_keeps_its_session() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let (agents, dispatcher) = (services(&db, &clock), services(&db, &clock));
    let rental = active_rental(&agents, "acme", "r1").await;
    let mut credential = enroll(&agents, rental).await.credential;
    for round in 0..ROUNDS {
        let again = Presented::Credential(&credential);
        let enrolled = agents.nodes.enroll(node1(rental), again, (agent_version(), facts()));
        // Orders keep coming until the enrollment is answered, so that some land between
        // its append and its answer.
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ordering: Vec<_> = (0..ORDERS)
            .map(|n| {
                let (nodes, answered) = (dispatcher.nodes.clone(), answered.clone());
                tokio::spawn(async move {
                    for look in 0..100 {
                        if answered.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let key = format!("lookup-{round}-{n}-{look}");
                        // One decided under the token before the enrollment is fenced: no matter.
                        let _ = nodes.ask_applied(&key, node1(rental)).await;
                    }
                })
            })
            .collect();
        let enrolled = enrolled.await;
        answered.store(true, std::sync::atomic::Ordering::Relaxed);
        for order in ordering {
            order.await.expect("the orders were sent");
        }
        let enrolled = enrolled.unwrap_or_else(|error| panic!("round {round}: {error:?}"));
        assert_eq!(enrolled.fencing_token, round as u64 + 2, "round {round}");
        credential = enrolled.credential;
    }
}

/// Rounds of the race above, and orders racing each enrollment: enough for an order to land
/// between an enrollment's append and its answer in most runs on a loaded 2-core machine.
const ROUNDS: usize = 100;
const ORDERS: usize = 12;
