//! `decide` for the runner lease: the transition table of `runner.rs`, row by row.

use chrono::{DateTime, TimeDelta, Utc};

use super::{
    InstanceRef, JobRef, Outcome, Phase, QuarantineProof, RunnerCommand, RunnerError, RunnerEvent,
    RunnerFacts, RunnerLease, RunnerNodeName, RunnerTerms, Teardown,
};
use crate::values::{OperatorDetail, Reason};

pub(super) fn decide(
    lease: &RunnerLease,
    command: &RunnerCommand,
    facts: &RunnerFacts,
    now: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    use RunnerCommand as C;
    let Some(terms) = &lease.terms else {
        return match command {
            C::Request { terms } => Ok(vec![requested(terms, now)]),
            _ => Err(RunnerError::NotFound),
        };
    };
    match command {
        C::Request { terms: asked } if asked == terms => Ok(Vec::new()),
        C::Request { .. } => Err(RunnerError::AlreadyExists),
        C::Reap => Ok(reap(lease, now)),
        C::NodeReregistered { node } => Ok(node_reregistered(lease, node, now)),
        C::ResolveQuarantine { proof } => Ok(resolve_quarantine(lease, proof, now)),
        C::ForceRelease { detail } => force_release(lease, detail, now),
        C::Assign { epoch, job } => fenced(lease, *epoch).and_then(|()| assign(lease, *job, now)),
        C::Launch { epoch, node } => {
            fenced(lease, *epoch).and_then(|()| launch(lease, terms, node, facts, now))
        }
        C::RecordInstance { epoch, instance } => {
            fenced(lease, *epoch).and_then(|()| record_instance(lease, instance, now))
        }
        C::Advance { epoch, phase } => {
            fenced(lease, *epoch).and_then(|()| advance(lease, terms, *phase, facts, now))
        }
        C::Heartbeat { epoch } => fenced(lease, *epoch).and_then(|()| heartbeat(lease, now)),
        C::Release { epoch, outcome, reason } => {
            fenced(lease, *epoch).and_then(|()| release(lease, *outcome, reason.as_ref(), now))
        }
        C::RecordTeardown { epoch, teardown } => {
            fenced(lease, *epoch).and_then(|()| record_teardown(lease, *teardown, now))
        }
    }
}

fn requested(terms: &RunnerTerms, at: DateTime<Utc>) -> RunnerEvent {
    RunnerEvent::RunnerLeaseRequested {
        terms: terms.clone(),
        epoch: 1,
        expires_at: at + ttl(terms),
        at,
    }
}

fn ttl(terms: &RunnerTerms) -> TimeDelta {
    TimeDelta::seconds(i64::from(terms.ttl_seconds))
}

/// When a report of its holder at `now` makes it expire.
fn expiry(lease: &RunnerLease, now: DateTime<Utc>) -> DateTime<Utc> {
    now + lease.terms.as_ref().map_or(TimeDelta::zero(), ttl)
}

fn fenced(lease: &RunnerLease, given: u64) -> Result<(), RunnerError> {
    if given == lease.epoch {
        Ok(())
    } else {
        Err(RunnerError::Fenced { given, current: lease.epoch })
    }
}

fn invalid(lease: &RunnerLease, command: &'static str) -> RunnerError {
    if lease.phase.is_terminal() {
        RunnerError::Finished { phase: lease.phase.name() }
    } else {
        RunnerError::InvalidState { phase: lease.phase.name(), command }
    }
}

/// The terminal phase it ends in: its recorded outcome's, failed when it has none.
fn ending(lease: &RunnerLease) -> Phase {
    Phase::of_outcome(lease.outcome.unwrap_or(Outcome::Failed))
}

fn assign(
    lease: &RunnerLease,
    job: JobRef,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    match lease.job {
        Some(held) if held == job => Ok(Vec::new()),
        Some(_) => Err(RunnerError::JobConflict),
        None if lease.phase == Phase::Capacity => {
            Ok(vec![RunnerEvent::RunnerJobAssigned { job, expires_at: expiry(lease, at), at }])
        }
        None => Err(invalid(lease, "be assigned a job")),
    }
}

fn launch(
    lease: &RunnerLease,
    terms: &RunnerTerms,
    node: &RunnerNodeName,
    facts: &RunnerFacts,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    match &lease.node {
        Some(bound) if bound == node && lease.phase >= Phase::Launching => return Ok(Vec::new()),
        Some(_) => return Err(RunnerError::WrongNode),
        None if lease.phase != Phase::Assigned => return Err(invalid(lease, "be launched")),
        None => {}
    }
    admitted(node, terms, facts)?;
    Ok(vec![RunnerEvent::RunnerLaunching { node: node.clone(), expires_at: expiry(lease, at), at }])
}

/// Whether `node`'s current policy admits the lease.
fn admitted(
    node: &RunnerNodeName,
    terms: &RunnerTerms,
    facts: &RunnerFacts,
) -> Result<(), RunnerError> {
    let policy = facts.policy.as_ref().filter(|policy| &policy.node == node);
    let problem = match policy {
        None => Some(super::PolicyProblem::NodeInactive),
        Some(policy) => policy.refuses(terms),
    };
    problem.map_or(Ok(()), |problem| Err(RunnerError::PolicyRefused { problem }))
}

fn record_instance(
    lease: &RunnerLease,
    instance: &InstanceRef,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    match &lease.instance {
        Some(recorded) if recorded == instance => Ok(Vec::new()),
        Some(_) => Err(RunnerError::OtherInstance),
        // A late answer after a release or a reap still names compute that must go.
        None if (Phase::Launching..=Phase::Quarantine).contains(&lease.phase) => {
            Ok(vec![RunnerEvent::RunnerInstanceLaunched { instance: instance.clone(), at }])
        }
        None => Err(invalid(lease, "record an instance")),
    }
}

fn advance(
    lease: &RunnerLease,
    terms: &RunnerTerms,
    to: Phase,
    facts: &RunnerFacts,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    if !matches!(to, Phase::Online | Phase::Busy | Phase::Custody) {
        return Err(RunnerError::InvalidState { phase: lease.phase.name(), command: "advance" });
    }
    if to == lease.phase {
        return Ok(Vec::new());
    }
    if lease.phase.is_terminal() {
        return Err(invalid(lease, "advance"));
    }
    if to < lease.phase {
        return Err(RunnerError::Backwards { phase: lease.phase.name(), to: to.name() });
    }
    if !lease.phase.moves().contains(&to) {
        return Err(invalid(lease, "advance"));
    }
    if to != Phase::Custody {
        let node = lease.node.as_ref().ok_or_else(|| invalid(lease, "advance"))?;
        admitted(node, terms, facts)?;
    }
    Ok(vec![RunnerEvent::RunnerAdvanced { phase: to, expires_at: expiry(lease, at), at }])
}

fn heartbeat(lease: &RunnerLease, at: DateTime<Utc>) -> Result<Vec<RunnerEvent>, RunnerError> {
    if !(Phase::Capacity..=Phase::Teardown).contains(&lease.phase) {
        return Err(invalid(lease, "beat"));
    }
    if !lease.records_heartbeat(at) {
        return Ok(Vec::new());
    }
    Ok(vec![RunnerEvent::RunnerHeartbeat { expires_at: expiry(lease, at), at }])
}

fn release(
    lease: &RunnerLease,
    outcome: Outcome,
    reason: Option<&Reason>,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    if let Some(recorded) = lease.outcome {
        return if recorded == outcome {
            Ok(Vec::new())
        } else {
            Err(RunnerError::OutcomeConflict { recorded })
        };
    }
    let phase = match lease.phase {
        Phase::Capacity | Phase::Assigned => Phase::of_outcome(outcome),
        Phase::Launching | Phase::Online | Phase::Busy | Phase::Custody => Phase::Teardown,
        // Reaped while it may hold compute: the outcome is recorded, the quarantine stands.
        Phase::Quarantine => Phase::Quarantine,
        _ => return Err(invalid(lease, "be released")),
    };
    let reason = reason.filter(|_| outcome == Outcome::Failed).cloned();
    Ok(vec![RunnerEvent::RunnerReleased { outcome, reason, phase, at }])
}

fn record_teardown(
    lease: &RunnerLease,
    teardown: Teardown,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    match (lease.phase, teardown) {
        (Phase::Teardown | Phase::Quarantine, Teardown::Requested) => {
            if lease.teardown == Some(Teardown::Requested) {
                Ok(Vec::new())
            } else {
                Ok(vec![RunnerEvent::RunnerTeardownRequested { at }])
            }
        }
        (Phase::Teardown | Phase::Quarantine, Teardown::Stopped) => {
            Ok(vec![RunnerEvent::RunnerTeardownConfirmed { phase: ending(lease), at }])
        }
        // Destroy is idempotent (rule 8): gone again is still gone.
        (Phase::Done | Phase::Failed, _) => Ok(Vec::new()),
        _ => Err(invalid(lease, "record a teardown")),
    }
}

fn reap(lease: &RunnerLease, now: DateTime<Utc>) -> Vec<RunnerEvent> {
    let reapable = (Phase::Capacity..=Phase::Teardown).contains(&lease.phase);
    if !reapable || !lease.is_expired(now) {
        return Vec::new();
    }
    // Unknown is running (rule 10): a lease that may hold compute stays charged.
    let phase = if lease.phase.may_hold_compute() { Phase::Quarantine } else { Phase::Failed };
    let reason = Reason::parse("reason", "Expired").expect("a valid reason");
    vec![RunnerEvent::RunnerReaped { phase, epoch: lease.epoch + 1, reason, at: now }]
}

fn node_reregistered(
    lease: &RunnerLease,
    node: &RunnerNodeName,
    at: DateTime<Utc>,
) -> Vec<RunnerEvent> {
    if lease.phase.is_terminal() || lease.node.as_ref() != Some(node) {
        return Vec::new();
    }
    vec![RunnerEvent::RunnerEpochBumped { epoch: lease.epoch + 1, node: node.clone(), at }]
}

fn resolve_quarantine(
    lease: &RunnerLease,
    proof: &QuarantineProof,
    now: DateTime<Utc>,
) -> Vec<RunnerEvent> {
    let QuarantineProof::InventoryAbsent { node, .. } = proof;
    // An absence is proof only of a quarantined lease of that node, expired past the grace
    // (an instance still being created may not be listed yet); otherwise it proves nothing.
    let proves = lease.phase == Phase::Quarantine
        && lease.node.as_ref() == Some(node)
        && lease.past_grace(now);
    if !proves {
        return Vec::new();
    }
    vec![RunnerEvent::RunnerQuarantineResolved {
        proof: proof.clone(),
        phase: ending(lease),
        at: now,
    }]
}

fn force_release(
    lease: &RunnerLease,
    detail: &OperatorDetail,
    at: DateTime<Utc>,
) -> Result<Vec<RunnerEvent>, RunnerError> {
    match lease.phase {
        Phase::Custody | Phase::Teardown | Phase::Quarantine => {
            Ok(vec![RunnerEvent::RunnerForceReleased {
                detail: detail.clone(),
                phase: ending(lease),
                at,
            }])
        }
        Phase::Done | Phase::Failed => Ok(Vec::new()),
        _ => Err(invalid(lease, "be force-released")),
    }
}
