//! `evolve` for the runner lease: no rules, only the facts each event records.

use super::{Outcome, Phase, RunnerEvent, RunnerLease, Teardown};

pub(super) fn evolve(mut lease: RunnerLease, event: &RunnerEvent) -> RunnerLease {
    use RunnerEvent as E;
    match event {
        E::RunnerLeaseRequested { terms, epoch, expires_at, at } => {
            lease.terms = Some(terms.clone());
            lease.epoch = *epoch;
            lease.expires_at = Some(*expires_at);
            lease.requested_at = Some(*at);
            enter(&mut lease, Phase::Capacity, *at);
        }
        E::RunnerJobAssigned { job, expires_at, at } => {
            lease.job = Some(*job);
            lease.expires_at = Some(*expires_at);
            enter(&mut lease, Phase::Assigned, *at);
        }
        E::RunnerLaunching { node, expires_at, at } => {
            lease.node = Some(node.clone());
            lease.expires_at = Some(*expires_at);
            enter(&mut lease, Phase::Launching, *at);
        }
        E::RunnerInstanceLaunched { instance, .. } => lease.instance = Some(instance.clone()),
        E::RunnerAdvanced { phase, expires_at, at } => {
            lease.expires_at = Some(*expires_at);
            enter(&mut lease, *phase, *at);
        }
        E::RunnerHeartbeat { expires_at, at } => {
            lease.expires_at = Some(*expires_at);
            lease.heartbeat_at = Some(*at);
        }
        E::RunnerReleased { outcome, reason, phase, at } => {
            lease.outcome = Some(*outcome);
            lease.failure_reason = reason.clone();
            enter(&mut lease, *phase, *at);
        }
        E::RunnerTeardownRequested { .. } => lease.teardown = Some(Teardown::Requested),
        E::RunnerTeardownConfirmed { phase, at } => {
            lease.teardown = Some(Teardown::Stopped);
            end(&mut lease, *phase, *at);
        }
        E::RunnerReaped { phase, epoch, reason, at } => {
            lease.epoch = *epoch;
            if lease.outcome.is_none() {
                lease.failure_reason = Some(reason.clone());
            }
            if phase.is_terminal() {
                end(&mut lease, *phase, *at);
            } else {
                enter(&mut lease, *phase, *at);
            }
        }
        E::RunnerEpochBumped { epoch, .. } => lease.epoch = *epoch,
        E::RunnerQuarantineResolved { phase, at, .. }
        | E::RunnerForceReleased { phase, at, .. } => {
            end(&mut lease, *phase, *at);
        }
    }
    lease.updated_at = Some(event_time(event));
    lease
}

/// Moves it into `phase` (its `held_since` restarts only when the phase changes).
fn enter(lease: &mut RunnerLease, phase: Phase, at: chrono::DateTime<chrono::Utc>) {
    debug_assert!(phase >= lease.phase, "a runner lease never moves backwards");
    if phase != lease.phase {
        lease.phase = phase;
        lease.held_since = Some(at);
    }
}

/// Ends it in `phase`, whose outcome it records.
fn end(lease: &mut RunnerLease, phase: Phase, at: chrono::DateTime<chrono::Utc>) {
    debug_assert!(phase.is_terminal(), "an ending is terminal");
    lease.outcome = Some(if phase == Phase::Done { Outcome::Done } else { Outcome::Failed });
    enter(lease, phase, at);
}

fn event_time(event: &RunnerEvent) -> chrono::DateTime<chrono::Utc> {
    use RunnerEvent as E;
    match event {
        E::RunnerLeaseRequested { at, .. }
        | E::RunnerJobAssigned { at, .. }
        | E::RunnerLaunching { at, .. }
        | E::RunnerInstanceLaunched { at, .. }
        | E::RunnerAdvanced { at, .. }
        | E::RunnerHeartbeat { at, .. }
        | E::RunnerReleased { at, .. }
        | E::RunnerTeardownRequested { at }
        | E::RunnerTeardownConfirmed { at, .. }
        | E::RunnerReaped { at, .. }
        | E::RunnerEpochBumped { at, .. }
        | E::RunnerQuarantineResolved { at, .. }
        | E::RunnerForceReleased { at, .. } => *at,
    }
}
