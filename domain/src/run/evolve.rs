//! The run's state after each event: no rules, only what the event records.

use super::{Cleanup, Launch, Run, RunEvent as E, RunStatus as S};
use crate::run::AttemptId;

pub(super) fn evolve(mut run: Run, event: &E) -> Run {
    match event {
        E::RunRequested { terms, at } => {
            run.status = S::Requested;
            run.terms = Some(terms.clone());
            run.requested_at = Some(*at);
        }
        E::RunBookingDecided { booking, .. } => {
            run.status = S::Booked;
            run.booking = Some(*booking);
        }
        E::RunBookingDispatched { .. } => {}
        E::RunAttemptCreated { attempt, .. } => {
            run.attempts.push(attempt.clone());
        }
        E::RunLaunchIntentRecorded { .. } => run.status = S::Launching,
        E::RunLaunchAccepted { attempt, .. } => {
            set_launch(&mut run, *attempt, Launch::Accepted);
            if run.outcome.is_none() {
                run.status = S::Running;
            }
        }
        E::RunLaunchFailed { attempt, reason, .. } => {
            set_launch(&mut run, *attempt, Launch::Failed);
            if let Some(failed) = run.attempts.iter().find(|known| known.attempt == *attempt) {
                run.excluded_offers.insert(failed.offer.clone());
            }
            run.failure = Some(reason.clone());
            if run.outcome.is_none() {
                run.status = S::Booked;
            }
        }
        E::RunLaunchNotApplied { attempt, .. } => {
            set_launch(&mut run, *attempt, Launch::Failed);
            if run.outcome.is_none() {
                run.status = S::Booked;
            }
        }
        E::RunLaunchIndeterminate { attempt, .. } => {
            set_launch(&mut run, *attempt, Launch::Indeterminate);
            if run.outcome.is_none() {
                run.status = S::Indeterminate;
            }
        }
        E::RunExternalStateObserved { observation, .. } => {
            let known = run.attempts.iter_mut().find(|known| known.attempt == observation.attempt);
            if let Some(known) = known {
                known.phase = Some(observation.phase);
                known.exit_code = observation.exit_code;
            }
        }
        E::RunOutcomeRecorded { outcome, exit_code, reason, .. } => {
            run.status = S::Finished;
            run.outcome = Some(*outcome);
            run.exit_code = *exit_code;
            if reason.is_some() {
                run.failure.clone_from(reason);
            }
        }
        E::RunCancelRequested { .. } => run.cancel_requested = true,
        E::RunStopOrdered { stop, .. } => run.stop = Some(*stop),
        E::RunStopFailed { .. } => {
            run.stop = None;
            run.stop_failures = run.stop_failures.saturating_add(1);
        }
        E::RunCancelAccepted { .. } | E::RunNodeRetired { .. } => {}
        E::RunCleanupRequested { .. } => run.cleanup = Some(Cleanup::Pending),
        E::RunCleanupFailed { .. } => run.cleanup = Some(Cleanup::Blocked),
        E::RunCleanupConfirmed { .. } => run.cleanup = Some(Cleanup::Confirmed),
        E::RunClosed { cleanup, .. } => {
            run.status = S::Closed;
            run.cleanup = Some(*cleanup);
        }
    }
    run.updated_at = Some(at(event));
    run
}

fn set_launch(run: &mut Run, attempt: AttemptId, launch: Launch) {
    if let Some(known) = run.attempts.iter_mut().find(|known| known.attempt == attempt) {
        known.launch = launch;
    }
}

fn at(event: &E) -> chrono::DateTime<chrono::Utc> {
    match event {
        E::RunRequested { at, .. }
        | E::RunBookingDecided { at, .. }
        | E::RunBookingDispatched { at }
        | E::RunAttemptCreated { at, .. }
        | E::RunLaunchIntentRecorded { at, .. }
        | E::RunLaunchAccepted { at, .. }
        | E::RunLaunchFailed { at, .. }
        | E::RunLaunchIndeterminate { at, .. }
        | E::RunLaunchNotApplied { at, .. }
        | E::RunOutcomeRecorded { at, .. }
        | E::RunCancelRequested { at }
        | E::RunStopOrdered { at, .. }
        | E::RunStopFailed { at, .. }
        | E::RunCancelAccepted { at }
        | E::RunCleanupRequested { at }
        | E::RunCleanupFailed { at, .. }
        | E::RunCleanupConfirmed { at }
        | E::RunNodeRetired { at, .. }
        | E::RunClosed { at, .. } => *at,
        E::RunExternalStateObserved { received_at, .. } => *received_at,
    }
}
