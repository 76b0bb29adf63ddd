//! Runs on a rental's node: an exit code counts only from `exited`, the first terminal fact
//! stands, and a launch whose answer was lost is never followed by another until the node's
//! reconciliation answers.

use leasehold_commands::run_service::SubmitRun;
use leasehold_commands::{CommandError, CommandOutcome};
use leasehold_domain::node::{ManifestDigest, NodeEvent};
use leasehold_domain::rental::RentalId;
use leasehold_domain::run::{
    AttemptId, Outcome, RunCommand, RunError, RunId, RunStatus, WorkloadObservation, WorkloadPhase,
};
use leasehold_domain::values::OperationId;
use leasehold_domain::{DomainEvent, TenantId};
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;
use uuid::Uuid;

use super::support::*;

fn digest() -> ManifestDigest {
    ManifestDigest::parse("d", format!("sha256:{}", "ef".repeat(32))).expect("valid")
}

fn acme() -> TenantId {
    TenantId::parse("acme").expect("valid")
}

/// A run of acme's submitted to `rental` and booked (running on its schedule).
pub async fn booked_run(services: &Services, rental: RentalId, key: &str) -> RunId {
    let ask = SubmitRun { rental, manifest_digest: digest(), max_runtime_seconds: 600 };
    services.runs.submit(&tenant("acme"), key, &ask).await.expect("submitted").run
}

/// Creates an attempt of `run` on `rental`'s node under `fencing_token`, as a dispatcher that
/// read that token would.
pub async fn create_attempt_under(
    services: &Services,
    run: RunId,
    rental: RentalId,
    fencing_token: u64,
) -> Result<CommandOutcome, CommandError<RunError>> {
    let command = RunCommand::CreateAttempt {
        attempt: AttemptId(Uuid::from_u128(77)),
        node: node1(rental),
        fencing_token,
        offer: ask().offer,
        operation: OperationId(Uuid::from_u128(78)),
    };
    let request = leasehold_commands::CommandRequest::<leasehold_domain::run::Run>::new(
        acme(),
        provider().actor,
        run.stream_id(),
        leasehold_domain::OperationKey::parse("stale-attempt").expect("valid"),
        command,
        (),
    );
    let follows = leasehold_commands::run_service::effects_follow(run);
    services.runs_pipeline().execute_following(request, &[], &follows).await
}

fn look(
    run: RunId,
    attempt: AttemptId,
    phase: WorkloadPhase,
    exit_code: Option<i32>,
) -> WorkloadObservation {
    WorkloadObservation {
        run,
        attempt,
        phase,
        observed_at: start() + chrono::TimeDelta::hours(6),
        started_at: None,
        finished_at: None,
        exit_code,
        oom_killed: false,
    }
}

/// A run launched on an enrolled node: its attempt and the node's enrollment.
pub(crate) async fn launched(
    services: &Services,
    db: &TestDb,
) -> (RunId, AttemptId, leasehold_commands::node_service::Enrollment) {
    let rental = active_rental(services, "acme", "r1").await;
    let enrolled = enroll(services, rental).await;
    let run = booked_run(services, rental, "run-1").await;
    services.runs.dispatch(&provider(), &acme(), run).await.expect("dispatched").expect("ready");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let attempt = stored.current().expect("an attempt").clone();
    let _ = db;
    (run, attempt.attempt, enrolled)
}

#[tokio::test]
async fn an_exit_code_while_running_decides_nothing_and_the_first_terminal_fact_stands() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, attempt, enrolled) = launched(&services, &db).await;
    let session = session_of(&services, &enrolled);
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let operation = stored.current().expect("attempt").operation;
    services
        .nodes
        .settle(&session, "applied", (operation, leasehold_domain::node::OperationResult::Applied))
        .await
        .expect("settled");
    assert_eq!(services.runs.owned(run).await.expect("read").1.status, RunStatus::Running);
    services
        .nodes
        .observe(&session, "zero-running", look(run, attempt, WorkloadPhase::Running, Some(0)))
        .await
        .expect("observed");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!((stored.outcome, stored.status), (None, RunStatus::Running), "exit 0 while running");
    services
        .nodes
        .observe(&session, "exit-3", look(run, attempt, WorkloadPhase::Exited, Some(3)))
        .await
        .expect("observed");
    services
        .nodes
        .observe(&session, "exit-0", look(run, attempt, WorkloadPhase::Exited, Some(0)))
        .await
        .expect("observed");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!(
        (stored.outcome, stored.exit_code),
        (Some(Outcome::Failed), Some(3)),
        "the first stands"
    );
}

#[tokio::test]
async fn a_lost_launch_answer_allows_no_second_launch_until_the_node_reconciles() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, attempt, enrolled) = launched(&services, &db).await;
    let session = session_of(&services, &enrolled);
    services.runs.launch_lost(&provider(), &acme(), (run, attempt)).await.expect("recorded");
    let again = services.runs.dispatch(&provider(), &acme(), run).await;
    assert!(
        matches!(again, Err(CommandError::Refused(RunError::LaunchIndeterminate))),
        "{again:?}"
    );
    // Within the session the launch was ordered in, a list without it settles nothing: the
    // order may still be on its way to the node.
    services.nodes.reconcile(&session, "early", (Vec::new(), None)).await.expect("reconciled");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!(stored.status, RunStatus::Indeterminate, "still indeterminate");
    // The node comes back on a new session (its old one refuses the launch order now) and
    // reconciles: it never applied the launch.
    let resumed = services
        .nodes
        .enroll(
            session.node,
            leasehold_commands::node_service::Presented::Credential(&enrolled.credential),
            (agent_version(), facts()),
        )
        .await
        .expect("resumed");
    let session = session_of(&services, &resumed);
    services.nodes.reconcile(&session, "reconciled", (Vec::new(), None)).await.expect("reconciled");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!(stored.status, RunStatus::Booked, "failed, never applied: free to replace");
    // Never a second launch order on the node for this run.
    let node_events = events_of(&db, &session.node.stream_id()).await;
    let launches = node_events
        .iter()
        .filter(|recorded| recorded.event_type.as_str() == "NodeOperationRequested")
        .count();
    assert_eq!(launches, 1);
    let applied = node_events.iter().any(|recorded| {
        NodeEvent::from_stored(recorded.event_type.as_str(), &recorded.payload)
            .is_ok_and(|event| matches!(event, NodeEvent::NodeOperationNotApplied { .. }))
    });
    assert!(applied, "the reconciliation recorded it not applied");
}

#[tokio::test]
async fn a_cancel_after_the_node_enrolled_again_orders_the_stop_under_its_new_token() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, _, enrolled) = launched(&services, &db).await;
    let session = session_of(&services, &enrolled);
    let node = session.node;
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let launch = stored.current().expect("attempt").operation;
    let applied = (launch, leasehold_domain::node::OperationResult::Applied);
    services.nodes.settle(&session, "launched", applied).await.expect("settled");
    let resumed = services
        .nodes
        .enroll(
            node,
            leasehold_commands::node_service::Presented::Credential(&enrolled.credential),
            (agent_version(), facts()),
        )
        .await
        .expect("resumed");
    assert_eq!(resumed.fencing_token, 2);
    services.runs.cancel(&tenant("acme"), "cancel", run).await.expect("cancelled");
    let stops: Vec<u64> = events_of(&db, &node.stream_id())
        .await
        .iter()
        .filter_map(|recorded| {
            match NodeEvent::from_stored(recorded.event_type.as_str(), &recorded.payload) {
                Ok(NodeEvent::NodeOperationRequested {
                    fencing_token,
                    order: leasehold_domain::node::NodeOrder::StopWorkload { .. },
                    ..
                }) => Some(fencing_token),
                _ => None,
            }
        })
        .collect();
    assert_eq!(stops, vec![2], "one stop, under the session that can take it");
    // The tenant's retry after the node enrolled again is the same request, not a conflict.
    let again = services
        .nodes
        .enroll(
            node,
            leasehold_commands::node_service::Presented::Credential(&resumed.credential),
            (agent_version(), facts()),
        )
        .await
        .expect("resumed again");
    assert_eq!(again.fencing_token, 3);
    services.runs.cancel(&tenant("acme"), "cancel", run).await.expect("the same cancel");
}

#[tokio::test]
async fn a_stop_the_node_refused_is_ordered_again_under_a_new_operation_until_it_takes() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, _, enrolled) = launched(&services, &db).await;
    let session = session_of(&services, &enrolled);
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let launch = stored.current().expect("attempt").operation;
    let applied = (launch, leasehold_domain::node::OperationResult::Applied);
    services.nodes.settle(&session, "launched", applied).await.expect("settled");
    services.runs.cancel(&tenant("acme"), "cancel", run).await.expect("cancelled");
    let stop_of = |stored: &leasehold_domain::run::Run| stored.stop.expect("a stop").operation;
    let first = stop_of(&services.runs.owned(run).await.expect("read").1);
    // The node refuses it (mercator's agent answers any runtime failure so).
    let reason = leasehold_domain::values::Reason::parse("reason", "NodeRefused").expect("ok");
    let refused = (first, leasehold_domain::node::OperationResult::Refused { reason });
    services.nodes.settle(&session, "stop-refused", refused).await.expect("recorded");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!((stored.stop, stored.stop_failures), (None, 1), "no stop ordered now");
    // The run dispatcher's look orders another, under a new operation; applied, it cancels.
    let again = services.runs.order_pending_stop(&provider(), &acme(), run).await.expect("ordered");
    assert!(again.is_some(), "a second stop ordered");
    let second = stop_of(&services.runs.owned(run).await.expect("read").1);
    assert_ne!(second, first, "one operation per try");
    let taken = (second, leasehold_domain::node::OperationResult::Applied);
    services.nodes.settle(&session, "stop-applied", taken).await.expect("settled");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!(stored.outcome, Some(leasehold_domain::run::Outcome::Cancelled));
}

#[tokio::test]
async fn an_attempt_of_a_booking_the_rental_does_not_run_is_refused_and_appends_nothing() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    enroll(&services, rental).await;
    booked_run(&services, rental, "run-1").await;
    // The second run waits behind the first on the rental's schedule; a dispatcher that read
    // the rental before it moved on would try to start it.
    let queued = booked_run(&services, rental, "run-2").await;
    let before = whole_log_text(&db).await;
    let refused = create_attempt_under(&services, queued, rental, 1).await;
    assert!(
        matches!(
            refused,
            Err(CommandError::LinkedRefused {
                kind: leasehold_domain::RefusalKind::InvalidState,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(whole_log_text(&db).await, before, "nothing appended");
    let (_, stored) = services.runs.owned(queued).await.expect("read");
    assert!(stored.current().is_none(), "no attempt of a run the rental does not run");
}

#[tokio::test]
async fn a_run_the_rental_cannot_book_fails_with_the_rentals_reason() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    // One running and four queued fill the schedule; the sixth is refused.
    for n in 0..5 {
        booked_run(&services, rental, &format!("run-{n}")).await;
    }
    let ask = SubmitRun { rental, manifest_digest: digest(), max_runtime_seconds: 600 };
    let full = services.runs.submit(&tenant("acme"), "run-full", &ask).await;
    assert!(matches!(full, Err(CommandError::LinkedRefused { .. })), "{full:?}");
    let failure = |key: &str| {
        let run = RunId(leasehold_commands::lease_service::minted_id("run", &acme(), key));
        let runs = &services.runs;
        async move {
            let (_, stored) = runs.owned(run).await.expect("read");
            (stored.outcome, stored.failure.map(|reason| reason.as_str().to_owned()))
        }
    };
    assert_eq!(failure("run-full").await, (Some(Outcome::Failed), Some("ScheduleFull".into())));
    // A stopped rental books nothing, and says so.
    services.rentals.stop(&tenant("acme"), "stop", (rental, 1)).await.expect("stopping");
    let stopped = services.runs.submit(&tenant("acme"), "run-stopped", &ask).await;
    assert!(stopped.is_err(), "{stopped:?}");
    assert_eq!(
        failure("run-stopped").await,
        (Some(Outcome::Failed), Some("RentalNotActive".into()))
    );
}

/// Two dispatchers (each its own process's services) race on one booked run while its node
/// enrolls again. Both compute the run's next attempt, under the fencing token each read:
/// the same attempt, under the same key. The loser must be answered with what was recorded
/// (or a refusal), never `IDEMPOTENCY_CONFLICT`: what a dispatcher asks is the attempt; the
/// token is what it read of the node, which another may read otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatchers_racing_a_reenrollment_never_conflict_on_the_attempts_key() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let dispatchers = [services(&db, &clock), services(&db, &clock)];
    let tenants = services(&db, &clock);
    let mut answers = Vec::new();
    for round in 0..ROUNDS {
        let rental = active_rental(&tenants, "acme", &format!("r{round}")).await;
        let enrolled = enroll(&tenants, rental).await;
        let run = booked_run(&tenants, rental, &format!("run-{round}")).await;
        let dispatch = |services: &Services| {
            let (runs, acme) = (services.runs.clone(), acme());
            async move { runs.dispatch(&provider(), &acme, run).await.map(|_| ()) }
        };
        let again = leasehold_commands::node_service::Presented::Credential(&enrolled.credential);
        let reenroll = tenants.nodes.enroll(node1(rental), again, (agent_version(), facts()));
        let racing: Vec<_> =
            (0..DISPATCHERS).map(|n| tokio::spawn(dispatch(&dispatchers[n % 2]))).collect();
        reenroll.await.expect("enrolled again");
        for dispatcher in racing {
            answers.push(dispatcher.await.expect("the dispatcher ran"));
        }
    }
    let conflicts: Vec<_> = answers
        .iter()
        .filter(|answer| matches!(answer, Err(CommandError::IdempotencyConflict)))
        .collect();
    assert!(
        conflicts.is_empty(),
        "{} of {} answers: {conflicts:?}",
        conflicts.len(),
        answers.len()
    );
}

/// Rounds of the race above, and dispatchers racing in each: enough for its windows to meet
/// on a loaded 2-core machine.
const ROUNDS: usize = 40;
const DISPATCHERS: usize = 6;

/// A dispatcher that looks again at a run whose attempt is on its way (or past it) finds
/// nothing to do: no second attempt, no refusal, nothing appended. Sent twice, a dispatch
/// answers as the run stands, as a client's retry would be answered.
#[tokio::test]
async fn a_dispatch_of_a_run_already_launching_or_running_finds_nothing_to_do() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, attempt, enrolled) = launched(&services, &db).await;
    let before = whole_log_text(&db).await;
    let again = services.runs.dispatch(&provider(), &acme(), run).await;
    assert!(matches!(again, Ok(None)), "launching: {again:?}");
    let session = session_of(&services, &enrolled);
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let launch = stored.current().expect("an attempt").operation;
    let applied = (launch, leasehold_domain::node::OperationResult::Applied);
    services.nodes.settle(&session, "launched", applied).await.expect("settled");
    let before_running = whole_log_text(&db).await;
    let again = services.runs.dispatch(&provider(), &acme(), run).await;
    assert!(matches!(again, Ok(None)), "running: {again:?}");
    assert_eq!(whole_log_text(&db).await, before_running, "nothing appended");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    assert_eq!(stored.attempts.len(), 1, "one attempt: {attempt:?}");
    assert_ne!(before, before_running);
}
