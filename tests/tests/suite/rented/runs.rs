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

/// A run launched on an enrolled node: its attempt and the node session.
async fn launched(
    services: &Services,
    db: &TestDb,
) -> (RunId, AttemptId, leasehold_commands::enrollment::NodeSession) {
    let rental = active_rental(services, "acme", "r1").await;
    let session = session_of(services, &enroll(services, rental).await);
    let run = booked_run(services, rental, "run-1").await;
    services.runs.dispatch(&provider(), &acme(), run).await.expect("dispatched").expect("ready");
    let (_, stored) = services.runs.owned(run).await.expect("read");
    let attempt = stored.current().expect("an attempt").clone();
    let _ = db;
    (run, attempt.attempt, session)
}

#[tokio::test]
async fn an_exit_code_while_running_decides_nothing_and_the_first_terminal_fact_stands() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let (run, attempt, session) = launched(&services, &db).await;
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
    let (run, attempt, session) = launched(&services, &db).await;
    services.runs.launch_lost(&provider(), &acme(), (run, attempt)).await.expect("recorded");
    let again = services.runs.dispatch(&provider(), &acme(), run).await;
    assert!(
        matches!(again, Err(CommandError::Refused(RunError::LaunchIndeterminate))),
        "{again:?}"
    );
    // The node's reconciliation: it never applied the launch.
    services.nodes.reconcile(&session, "reconciled", Vec::new()).await.expect("reconciled");
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
