//! `decide` for the run: the transition table of `run.rs`, row by row.

use chrono::{DateTime, Utc};

use super::{
    Attempt, AttemptId, Cleanup, Launch, LaunchAnswer, Outcome, Run, RunBooking, RunCommand,
    RunError, RunEvent, RunStatus, StopOrder, WorkloadObservation, WorkloadPhase,
};
use crate::node::NodeId;
use crate::rental::OfferId;
use crate::values::{OperationId, Reason};

pub(super) fn decide(
    run: &Run,
    command: &RunCommand,
    now: DateTime<Utc>,
) -> Result<Vec<RunEvent>, RunError> {
    use RunCommand as C;
    use RunStatus as S;
    let at = now;
    match (run.status, command) {
        (S::None, C::Submit { terms }) => {
            Ok(vec![RunEvent::RunRequested { terms: terms.clone(), at }])
        }
        (_, C::Submit { terms }) => {
            if run.terms.as_ref() == Some(terms) {
                Ok(Vec::new())
            } else {
                Err(RunError::AlreadyExists)
            }
        }
        (S::None, _) => Err(RunError::NotFound),
        (_, C::Book { booking }) if run.booking == Some(*booking) => Ok(Vec::new()),
        (S::Requested, C::Book { booking }) => Ok(booked(*booking, at)),
        (S::Booked, C::Book { booking }) if last_failed(run) => Ok(booked(*booking, at)),
        (_, C::CreateAttempt { attempt, node, fencing_token, offer, operation }) => {
            create_attempt(run, *attempt, *node, *fencing_token, offer, *operation, at)
        }
        (S::Closed, C::LaunchAnswered { .. }) => Ok(Vec::new()),
        (_, C::LaunchAnswered { attempt, answer }) => launch_answered(run, *attempt, answer, at),
        (_, C::Observe { node, observation, received_at }) => {
            observe(run, *node, observation, *received_at)
        }
        (S::Requested | S::Booked, C::GiveUp { reason })
            if !launch_in_flight(run) && run.outcome.is_none() =>
        {
            Ok(vec![
                outcome(Outcome::Failed, None, Some(reason.clone()), at),
                closed(Cleanup::NotRequired, at),
            ])
        }
        (_, C::Cancel { stop }) => Ok(cancel(run, *stop, at)),
        (_, C::CancelAccepted) => cancel_accepted(run, at),
        (_, C::StopFailed { operation }) => Ok(stop_failed(run, *operation, at)),
        (S::Finished, C::ConfirmCleanup) => {
            Ok(vec![RunEvent::RunCleanupConfirmed { at }, closed(Cleanup::Confirmed, at)])
        }
        (S::Closed, C::ConfirmCleanup | C::NodeRetired { .. }) => Ok(Vec::new()),
        (_, C::NodeRetired { node }) => Ok(node_retired(run, *node, at)),
        (S::Finished, C::FailCleanup { reason }) => Ok(if run.cleanup == Some(Cleanup::Blocked) {
            Vec::new()
        } else {
            vec![RunEvent::RunCleanupFailed { reason: reason.clone(), at }]
        }),
        (status, command) => {
            Err(RunError::InvalidState { status: status.name(), command: name(command) })
        }
    }
}

fn booked(booking: RunBooking, at: DateTime<Utc>) -> Vec<RunEvent> {
    vec![RunEvent::RunBookingDecided { booking, at }]
}

fn outcome(
    outcome: Outcome,
    exit_code: Option<i32>,
    reason: Option<Reason>,
    at: DateTime<Utc>,
) -> RunEvent {
    RunEvent::RunOutcomeRecorded { outcome, exit_code, reason, at }
}

fn closed(cleanup: Cleanup, at: DateTime<Utc>) -> RunEvent {
    RunEvent::RunClosed { cleanup, at }
}

fn last_failed(run: &Run) -> bool {
    run.current().is_some_and(|attempt| attempt.launch == Launch::Failed)
}

/// Whether an attempt's launch may have taken effect and has no settled answer, or took it.
fn launch_in_flight(run: &Run) -> bool {
    run.current().is_some_and(|attempt| attempt.launch != Launch::Failed)
}

#[allow(clippy::too_many_arguments)] // One per field of the attempt it records.
fn create_attempt(
    run: &Run,
    attempt: AttemptId,
    node: NodeId,
    fencing_token: u64,
    offer: &OfferId,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Result<Vec<RunEvent>, RunError> {
    if run.current().is_some_and(|current| current.attempt == attempt) {
        return Ok(Vec::new());
    }
    if run.status == RunStatus::Indeterminate {
        return Err(RunError::LaunchIndeterminate);
    }
    if run.status != RunStatus::Booked || launch_in_flight(run) || run.cancel_requested {
        return Err(RunError::InvalidState {
            status: run.status.name(),
            command: "create an attempt",
        });
    }
    if run.excluded_offers.contains(offer) {
        return Err(RunError::OfferExcluded);
    }
    let booking = run.booking.expect("a booked run has its booking");
    let mut events = Vec::new();
    if run.attempts.is_empty() {
        events.push(RunEvent::RunBookingDispatched { at });
    }
    let created = Attempt {
        attempt,
        rental: booking.rental,
        node,
        fencing_token,
        offer: offer.clone(),
        operation,
        launch: Launch::Intended,
        phase: None,
        exit_code: None,
    };
    events.push(RunEvent::RunAttemptCreated { attempt: created, at });
    events.push(RunEvent::RunLaunchIntentRecorded { attempt, operation, at });
    Ok(events)
}

fn launch_answered(
    run: &Run,
    attempt: AttemptId,
    answer: &LaunchAnswer,
    at: DateTime<Utc>,
) -> Result<Vec<RunEvent>, RunError> {
    let Some(known) = run.attempts.iter().find(|known| known.attempt == attempt) else {
        return Err(RunError::NoSuchAttempt);
    };
    let current = run.current().is_some_and(|current| current.attempt == attempt);
    match (known.launch, answer) {
        (Launch::Intended | Launch::Indeterminate, LaunchAnswer::Accepted) if current => {
            Ok(vec![RunEvent::RunLaunchAccepted { attempt, at }])
        }
        (Launch::Intended | Launch::Indeterminate, LaunchAnswer::Failed { reason }) if current => {
            let mut events =
                vec![RunEvent::RunLaunchFailed { attempt, reason: reason.clone(), at }];
            if run.cancel_requested && run.outcome.is_none() {
                events.push(outcome(Outcome::Cancelled, None, None, at));
                events.push(closed(Cleanup::NotRequired, at));
            }
            Ok(events)
        }
        (Launch::Intended | Launch::Indeterminate, LaunchAnswer::NotApplied) if current => {
            let mut events = vec![RunEvent::RunLaunchNotApplied { attempt, at }];
            if run.cancel_requested && run.outcome.is_none() {
                events.push(outcome(Outcome::Cancelled, None, None, at));
                events.push(closed(Cleanup::NotRequired, at));
            }
            Ok(events)
        }
        (Launch::Intended, LaunchAnswer::Indeterminate) if current => {
            Ok(vec![RunEvent::RunLaunchIndeterminate { attempt, at }])
        }
        (Launch::Accepted, LaunchAnswer::Accepted | LaunchAnswer::Indeterminate)
        | (
            Launch::Failed,
            LaunchAnswer::Failed { .. } | LaunchAnswer::NotApplied | LaunchAnswer::Indeterminate,
        )
        | (Launch::Indeterminate, LaunchAnswer::Indeterminate) => Ok(Vec::new()),
        _ => Err(RunError::ReportContradicts),
    }
}

fn observe(
    run: &Run,
    node: NodeId,
    observation: &WorkloadObservation,
    received_at: DateTime<Utc>,
) -> Result<Vec<RunEvent>, RunError> {
    // Another node's report on this attempt is about nothing it runs.
    let known = run.attempts.iter().find(|known| known.attempt == observation.attempt);
    let Some(known) = known.filter(|known| known.node == node) else {
        return Err(RunError::NoSuchAttempt);
    };
    if run.status == RunStatus::Closed {
        return Ok(Vec::new());
    }
    let at = received_at;
    let phase = observation.phase;
    let mut recorded = observation.clone();
    if phase != WorkloadPhase::Exited {
        // An exit code counts only in phase exited (a node reporting 0 while running).
        recorded.exit_code = None;
    }
    let mut events = Vec::new();
    let current = run.current().is_some_and(|current| current.attempt == known.attempt);
    if current {
        let shows_launched = !matches!(phase, WorkloadPhase::Absent);
        if shows_launched && matches!(known.launch, Launch::Intended | Launch::Indeterminate) {
            events.push(RunEvent::RunLaunchAccepted { attempt: known.attempt, at });
        }
        match (phase, recorded.exit_code, run.outcome) {
            (WorkloadPhase::Exited, Some(code), None) => {
                let ended = if code == 0 { Outcome::Succeeded } else { Outcome::Failed };
                events.push(outcome(ended, Some(code), None, at));
                events.push(RunEvent::RunCleanupRequested { at });
            }
            (WorkloadPhase::Absent, _, Some(_)) if run.status == RunStatus::Finished => {
                events.push(RunEvent::RunCleanupConfirmed { at });
                events.push(closed(Cleanup::Confirmed, at));
            }
            _ => {}
        }
    }
    if events.is_empty() && known.phase == Some(phase) && known.exit_code == recorded.exit_code {
        return Ok(Vec::new());
    }
    events.insert(0, RunEvent::RunExternalStateObserved { observation: recorded, received_at });
    Ok(events)
}

fn cancel(run: &Run, stop: Option<StopOrder>, at: DateTime<Utc>) -> Vec<RunEvent> {
    if run.outcome.is_some() {
        return Vec::new();
    }
    let mut events = Vec::new();
    if !run.cancel_requested {
        events.push(RunEvent::RunCancelRequested { at });
        if !launch_in_flight(run) {
            events.push(outcome(Outcome::Cancelled, None, None, at));
            events.push(closed(Cleanup::NotRequired, at));
            return events;
        }
    }
    // Only a launch known to be accepted is stopped: a stop sent while the launch's answer
    // is out could reach the node before the launch, stop nothing, and be applied, while the
    // launch then runs.
    let current = run.current().filter(|_| run.status == RunStatus::Running);
    if let (Some(attempt), Some(stop), None) = (current, stop, run.stop) {
        events.push(RunEvent::RunStopOrdered { attempt: attempt.attempt, stop, at });
    }
    events
}

fn cancel_accepted(run: &Run, at: DateTime<Utc>) -> Result<Vec<RunEvent>, RunError> {
    if !run.cancel_requested {
        return Err(RunError::InvalidState {
            status: run.status.name(),
            command: "accept a cancel never asked",
        });
    }
    if run.outcome.is_some() {
        // The exit came first: the first terminal fact stands.
        return Ok(Vec::new());
    }
    if run.stop.is_none() {
        return Err(RunError::InvalidState {
            status: run.status.name(),
            command: "accept a stop never ordered",
        });
    }
    Ok(vec![
        RunEvent::RunCancelAccepted { at },
        outcome(Outcome::Cancelled, None, None, at),
        RunEvent::RunCleanupRequested { at },
    ])
}

/// The node did not act on the stop `operation`: if it is the one ordered and the run has no
/// outcome yet, the stop is to be ordered again.
fn stop_failed(run: &Run, operation: OperationId, at: DateTime<Utc>) -> Vec<RunEvent> {
    let ordered = run.stop.is_some_and(|stop| stop.operation == operation);
    match run.current() {
        Some(current) if ordered && run.outcome.is_none() => {
            vec![RunEvent::RunStopFailed { attempt: current.attempt, at }]
        }
        _ => Vec::new(),
    }
}

/// The node `node` is retired. When it is the current attempt's and that attempt's launch
/// may have run (ordered, unanswered or accepted), the machine's generation ended under it:
/// a positive fact that nothing of it runs any more. The first terminal fact still wins
/// (an outcome recorded stands; else the run failed, or is cancelled when a cancel was
/// asked), and the cleanup is confirmed by the machine's end. An attempt whose launch failed
/// and that decided nothing leaves nothing behind: its booking waits for the next
/// generation's node (one whose workload was seen exiting all the same has an outcome, and
/// its cleanup is what the machine's end confirms).
fn node_retired(run: &Run, node: NodeId, at: DateTime<Utc>) -> Vec<RunEvent> {
    let Some(current) = run.current().filter(|current| current.node == node) else {
        return Vec::new();
    };
    if current.launch == Launch::Failed && run.outcome.is_none() {
        return Vec::new();
    }
    let mut events = vec![RunEvent::RunNodeRetired { attempt: current.attempt, at }];
    if run.outcome.is_none() {
        events.push(if run.cancel_requested {
            outcome(Outcome::Cancelled, None, None, at)
        } else {
            let reason = Reason::parse("reason", "NodeRetired").expect("a valid reason");
            outcome(Outcome::Failed, None, Some(reason), at)
        });
    }
    events.push(RunEvent::RunCleanupConfirmed { at });
    events.push(closed(Cleanup::Confirmed, at));
    events
}

fn name(command: &RunCommand) -> &'static str {
    match command {
        RunCommand::Submit { .. } => "submit",
        RunCommand::Book { .. } => "book",
        RunCommand::CreateAttempt { .. } => "create an attempt",
        RunCommand::LaunchAnswered { .. } => "answer a launch",
        RunCommand::Observe { .. } => "be observed",
        RunCommand::GiveUp { .. } => "give up",
        RunCommand::Cancel { .. } => "cancel",
        RunCommand::CancelAccepted => "accept a cancel",
        RunCommand::StopFailed { .. } => "fail its stop",
        RunCommand::ConfirmCleanup => "confirm its cleanup",
        RunCommand::FailCleanup { .. } => "fail its cleanup",
        RunCommand::NodeRetired { .. } => "end with its node",
    }
}
