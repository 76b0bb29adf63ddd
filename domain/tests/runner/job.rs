//! A job held by one lease across all of them (`domain/src/runner_job.rs`), row by row, and
//! the job effects of a lease's events.

use leasehold_domain::runner::{Outcome, Phase, RunnerCommand, RunnerLeaseId, Teardown};
use leasehold_domain::runner_job::{
    JobStatus, RunnerJob, RunnerJobCommand as C, RunnerJobError, job_effect,
};
use leasehold_domain::{Aggregate, Context, Refusal, RefusalKind};
use uuid::Uuid;

use super::fixtures::{self, Expect, history, job, reason, replay, t, teardown};
use super::table;

use Expect::{Events, NoChange, Refused};

fn ctx_at(second: i64) -> Context<()> {
    let facts = fixtures::ctx_at(second);
    Context {
        now: facts.now,
        tenant: facts.tenant,
        actor: facts.actor,
        new_ids: Vec::new(),
        facts: (),
    }
}

fn check(given: &[C], when: C, expect: Expect<RunnerJobError>) -> RunnerJob {
    let given: Vec<(C, i64)> = given.iter().cloned().map(|command| (command, 1)).collect();
    table::check_at(&given, (when, 2), expect, ctx_at)
}

fn lease(n: u128) -> RunnerLeaseId {
    RunnerLeaseId(Uuid::from_u128(n))
}

fn claim(n: u128) -> C {
    let tier = fixtures::terms().tier;
    C::Claim { lease: lease(n), job: job(1), tier, queued_at: t(0) }
}

fn finish(n: u128, outcome: Outcome) -> C {
    C::Finish { lease: lease(n), outcome, reason: None }
}

#[test]
fn one_lease_holds_a_job_and_another_lease_claiming_it_conflicts() {
    let held = check(&[], claim(1), Events(&["RunnerJobClaimed"]));
    assert_eq!((held.status, held.lease), (JobStatus::Assigned, Some(lease(1))));
    check(&[claim(1)], claim(1), NoChange);
    check(&[claim(1)], claim(2), Refused(RunnerJobError::Taken));
    check(&[claim(1), finish(1, Outcome::Done)], claim(2), Refused(RunnerJobError::Taken));
    assert_eq!(RunnerJobError::Taken.kind(), RefusalKind::Conflict);
}

#[test]
fn only_its_holder_finishes_a_job_and_once() {
    let done = check(&[claim(1)], finish(1, Outcome::Done), Events(&["RunnerJobFinished"]));
    assert_eq!((done.status, done.outcome), (JobStatus::Finished, Some(Outcome::Done)));
    check(&[claim(1)], finish(2, Outcome::Failed), NoChange);
    check(&[claim(1), finish(1, Outcome::Done)], finish(1, Outcome::Done), NoChange);
    check(&[], finish(1, Outcome::Done), NoChange);
}

#[test]
fn a_lease_claims_its_job_when_assigned_and_finishes_it_when_it_ends() {
    let terms = fixtures::terms();
    let capacity = replay(&history(Phase::Capacity));
    let events = capacity.decide(&fixtures::assign(1, 1), &fixtures::ctx_at(50)).expect("assigned");
    let claim = C::Claim { lease: terms.lease, job: job(1), tier: terms.tier, queued_at: t(0) };
    assert_eq!(job_effect(&capacity, &events), Some((job(1), claim)));
    let busy = replay(&history(Phase::Busy));
    let released = busy.decide(&fixtures::release(1, Outcome::Failed), &fixtures::ctx_at(50));
    assert_eq!(job_effect(&busy, &released.expect("released")), None, "not ended yet");
    let mut teardown_phase = history(Phase::Busy);
    teardown_phase.push((fixtures::release(1, Outcome::Failed), 20));
    let tearing = replay(&teardown_phase);
    let stopped = tearing.decide(&teardown(1, Teardown::Stopped), &fixtures::ctx_at(50));
    let finish = C::Finish {
        lease: terms.lease,
        outcome: Outcome::Failed,
        reason: Some(reason("JobFailed")),
    };
    assert_eq!(job_effect(&tearing, &stopped.expect("stopped")), Some((job(1), finish)));
    // Ended without a job: nothing to finish.
    let released = capacity.decide(&fixtures::release(1, Outcome::Done), &fixtures::ctx_at(50));
    assert_eq!(job_effect(&capacity, &released.expect("released")), None);
    let reaped = busy.decide(&RunnerCommand::Reap, &fixtures::ctx_at(200)).expect("reaped");
    assert_eq!(job_effect(&busy, &reaped), None, "quarantined: not ended");
}
