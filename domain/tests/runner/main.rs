//! The runner lease's transition table, row by row (the doc comment of
//! `domain/src/runner.rs`): every allowed phase move and every forbidden one, each guard's
//! refusal, the fence, reaps and quarantine's proofs; then the tenant's runner capacity and
//! the runner node (`capacity.rs`, `node.rs`) and properties over random command sequences.

mod capacity;
mod fixtures;
mod job;
mod node;
mod properties;
#[path = "../common/table.rs"]
mod table;

use fixtures::*;
use leasehold_domain::runner::{
    GuestOs, Outcome, Phase, PolicyProblem, ProviderKind, RunnerCommand as C, RunnerError,
    Teardown, TrustClass,
};
use leasehold_domain::{Aggregate, Refusal, RefusalKind};

use Expect::{Events, NoChange, Refused};

fn invalid(phase: Phase, command: &'static str) -> Expect<RunnerError> {
    Refused(RunnerError::InvalidState { phase: phase.name(), command })
}

fn finished(phase: Phase) -> Expect<RunnerError> {
    Refused(RunnerError::Finished { phase: phase.name() })
}

#[test]
fn a_request_opens_the_capacity_phase_at_epoch_one() {
    let lease = check(&[], request(), Events(&["RunnerLeaseRequested"]));
    assert_eq!((lease.phase, lease.epoch), (Phase::Capacity, 1));
    assert_eq!(lease.expires_at, Some(t(50 + TTL)), "it lives its time to live");
    assert!(!lease.is_charged(), "nothing is charged before a job is assigned");
    check(&history(Phase::Capacity), request(), NoChange);
    let mut other = terms();
    other.trust = TrustClass::Untrusted;
    check(
        &history(Phase::Capacity),
        C::Request { terms: other },
        Refused(RunnerError::AlreadyExists),
    );
    assert_eq!(RunnerError::AlreadyExists.kind(), RefusalKind::Conflict);
}

#[test]
fn anything_but_a_request_on_nothing_is_not_found() {
    for command in
        [assign(1, 1), launch(1, "a"), heartbeat(1), release(1, Outcome::Done), C::Reap, force()]
    {
        check(&[], command, Refused(RunnerError::NotFound));
    }
}

#[test]
fn assigning_the_same_job_again_is_idempotent_and_another_job_conflicts() {
    let lease = check(&history(Phase::Capacity), assign(1, 1), Events(&["RunnerJobAssigned"]));
    assert_eq!(lease.phase, Phase::Assigned);
    assert!(lease.is_charged(), "charged from its assignment");
    for phase in [Phase::Assigned, Phase::Launching, Phase::Busy, Phase::Teardown] {
        check(&history(phase), assign(1, 1), NoChange);
        check(&history(phase), assign(1, 2), Refused(RunnerError::JobConflict));
    }
    assert_eq!(RunnerError::JobConflict.kind(), RefusalKind::Conflict);
    // Released before any job: it has ended.
    check(&history(Phase::Done), assign(1, 1), finished(Phase::Done));
}

#[test]
fn every_command_of_a_holder_with_another_epoch_is_fenced() {
    let busy = history(Phase::Busy);
    let fenced = |given| Refused(RunnerError::Fenced { given, current: 1 });
    for epoch in [0, 2, 9] {
        for command in [
            assign(epoch, 1),
            launch(epoch, "a"),
            record_instance(epoch, "c-1"),
            advance(epoch, Phase::Custody),
            heartbeat(epoch),
            release(epoch, Outcome::Done),
            teardown(epoch, Teardown::Stopped),
        ] {
            check(&busy, command, fenced(epoch));
        }
    }
    assert_eq!(RunnerError::Fenced { given: 0, current: 1 }.kind(), RefusalKind::Fenced);
}

#[test]
fn a_launch_binds_a_node_whose_current_policy_admits_the_lease() {
    let lease = check(&history(Phase::Assigned), launch(1, "a"), Events(&["RunnerLaunching"]));
    assert_eq!((lease.phase, lease.node), (Phase::Launching, Some(node("a"))));
    check(&history(Phase::Launching), launch(1, "a"), NoChange);
    check(&history(Phase::Busy), launch(1, "a"), NoChange);
    check(&history(Phase::Launching), launch(1, "b"), Refused(RunnerError::WrongNode));
    check(&history(Phase::Capacity), launch(1, "a"), invalid(Phase::Capacity, "be launched"));
    let assigned = replay(&history(Phase::Assigned));
    for (policy, problem) in [
        (None, PolicyProblem::NodeInactive),
        (Some(policy("b")), PolicyProblem::NodeInactive),
        (Some(inactive("a")), PolicyProblem::NodeInactive),
        (Some(provider("a", ProviderKind::Ec2)), PolicyProblem::Provider),
        (Some(guest("a", GuestOs::Macos)), PolicyProblem::GuestOs),
        (Some(accepting("a", TrustClass::Untrusted)), PolicyProblem::Trust),
    ] {
        let decided = assigned.decide(&launch(1, "a"), &ctx_with(50, policy.clone()));
        assert_eq!(decided, Err(RunnerError::PolicyRefused { problem }), "{policy:?}");
    }
    assert_eq!(
        RunnerError::PolicyRefused { problem: PolicyProblem::Trust }.kind(),
        RefusalKind::InvalidState
    );
}

#[test]
fn the_instance_is_recorded_once_even_when_its_answer_comes_late() {
    let launching =
        history(Phase::Assigned).into_iter().chain([(launch(1, "a"), 10)]).collect::<Vec<_>>();
    let lease = check(&launching, record_instance(1, "c-1"), Events(&["RunnerInstanceLaunched"]));
    assert_eq!(lease.instance, Some(instance("c-1")));
    check(&history(Phase::Launching), record_instance(1, "c-1"), NoChange);
    check(
        &history(Phase::Launching),
        record_instance(1, "c-2"),
        Refused(RunnerError::OtherInstance),
    );
    // Released before the launch's answer came: the instance must still be known to go.
    let mut released = launching.clone();
    released.push((release(1, Outcome::Failed), 11));
    check(&released, record_instance(1, "c-1"), Events(&["RunnerInstanceLaunched"]));
    check(
        &history(Phase::Assigned),
        record_instance(1, "c-1"),
        invalid(Phase::Assigned, "record an instance"),
    );
}

/// Every phase a holder may report against every phase a lease can be in: allowed exactly
/// where DOMAIN.md §1.8 allows the move, never backwards, never into teardown, quarantine or
/// an end (those have commands of their own).
#[test]
fn advance_moves_only_forward_along_the_allowed_moves() {
    for from in Phase::ALL.into_iter().filter(|phase| *phase != Phase::None) {
        for to in Phase::ALL.into_iter().filter(|phase| *phase != Phase::None) {
            let expect = if !matches!(to, Phase::Online | Phase::Busy | Phase::Custody) {
                Refused(RunnerError::InvalidState { phase: from.name(), command: "advance" })
            } else if to == from {
                NoChange
            } else if from.is_terminal() {
                finished(from)
            } else if to < from {
                Refused(RunnerError::Backwards { phase: from.name(), to: to.name() })
            } else if from.moves().contains(&to) {
                Events(&["RunnerAdvanced"])
            } else {
                invalid(from, "advance")
            };
            let epoch = replay(&history(from)).epoch;
            let lease = check_at(&history(from), advance(epoch, to), 210, expect);
            assert!(lease.phase >= from, "{from:?} -> {to:?} went backwards");
        }
    }
}

#[test]
fn the_allowed_moves_are_exactly_domains() {
    use Phase::*;
    let allowed: [(Phase, &[Phase]); 10] = [
        (Capacity, &[Assigned, Done, Failed]),
        (Assigned, &[Launching, Done, Failed]),
        (Launching, &[Online, Custody, Teardown, Quarantine, Done, Failed]),
        (Online, &[Busy, Custody, Teardown, Quarantine, Done, Failed]),
        (Busy, &[Custody, Teardown, Quarantine, Done, Failed]),
        (Custody, &[Teardown, Quarantine, Done, Failed]),
        (Teardown, &[Quarantine, Done, Failed]),
        (Quarantine, &[Done, Failed]),
        (Done, &[]),
        (Failed, &[]),
    ];
    for (from, to) in allowed {
        assert_eq!(from.moves(), to, "{from:?}");
        assert!(to.iter().all(|next| *next > from), "{from:?} never moves backwards");
    }
}

#[test]
fn online_and_busy_recheck_the_bound_nodes_current_policy() {
    let launching = replay(&history(Phase::Launching));
    let narrowed = accepting("a", TrustClass::Untrusted);
    for (from, to) in [(Phase::Launching, Phase::Online), (Phase::Online, Phase::Busy)] {
        let launching = replay(&history(from));
        let decided = launching.decide(&advance(1, to), &ctx_with(50, Some(narrowed.clone())));
        let problem = PolicyProblem::Trust;
        assert_eq!(decided, Err(RunnerError::PolicyRefused { problem }), "{to:?}");
        let retired = launching.decide(&advance(1, to), &ctx_with(50, Some(inactive("a"))));
        assert!(matches!(retired, Err(RunnerError::PolicyRefused { .. })), "{to:?}");
    }
    // Custody is the node holding what it cannot vouch for: no policy needed to say so.
    let custody = launching.decide(&advance(1, Phase::Custody), &ctx_with(50, None));
    assert!(matches!(custody.as_deref(), Ok([_])), "{custody:?}");
}

#[test]
fn heartbeats_extend_the_lease_and_are_recorded_at_most_every_thirty_seconds() {
    let busy = history(Phase::Busy);
    let lease = check_at(&busy, heartbeat(1), 40, Events(&["RunnerHeartbeat"]));
    assert_eq!(lease.expires_at, Some(t(40 + TTL)));
    let mut beaten = busy.clone();
    beaten.push((heartbeat(1), 40));
    check_at(&beaten, heartbeat(1), 69, NoChange);
    check_at(&beaten, heartbeat(1), 70, Events(&["RunnerHeartbeat"]));
    for phase in [Phase::Capacity, Phase::Assigned, Phase::Teardown] {
        let epoch = replay(&history(phase)).epoch;
        check_at(&history(phase), heartbeat(epoch), 40, Events(&["RunnerHeartbeat"]));
    }
    check_at(&history(Phase::Quarantine), heartbeat(2), 210, invalid(Phase::Quarantine, "beat"));
    check(&history(Phase::Done), heartbeat(1), finished(Phase::Done));
}

#[test]
fn a_release_ends_a_lease_without_compute_and_tears_down_one_with() {
    let lease =
        check(&history(Phase::Capacity), release(1, Outcome::Done), Events(&["RunnerReleased"]));
    assert_eq!(lease.phase, Phase::Done);
    let lease =
        check(&history(Phase::Assigned), release(1, Outcome::Failed), Events(&["RunnerReleased"]));
    assert_eq!((lease.phase, lease.failure_reason), (Phase::Failed, Some(reason("JobFailed"))));
    for phase in [Phase::Launching, Phase::Online, Phase::Busy, Phase::Custody] {
        let lease = check(&history(phase), release(1, Outcome::Done), Events(&["RunnerReleased"]));
        assert_eq!(lease.phase, Phase::Teardown, "{phase:?}: its compute goes first");
        assert!(lease.is_charged(), "{phase:?}: still charged until the compute is gone");
    }
}

#[test]
fn the_same_release_again_is_idempotent_and_a_contradictory_one_conflicts() {
    for phase in [Phase::Teardown, Phase::Done] {
        check(&history(phase), release(1, Outcome::Done), NoChange);
        let conflict = Refused(RunnerError::OutcomeConflict { recorded: Outcome::Done });
        check(&history(phase), release(1, Outcome::Failed), conflict);
    }
    let conflict = RunnerError::OutcomeConflict { recorded: Outcome::Done };
    assert_eq!(conflict.kind(), RefusalKind::Conflict);
    // A reaped lease failed: releasing it failed agrees, done contradicts.
    let mut reaped = history(Phase::Assigned);
    reaped.push((C::Reap, 200));
    check_at(&reaped, release(2, Outcome::Failed), 201, NoChange);
    let conflict = Refused(RunnerError::OutcomeConflict { recorded: Outcome::Failed });
    check_at(&reaped, release(2, Outcome::Done), 201, conflict);
    // Quarantined: the outcome is recorded and the quarantine stands.
    let lease = check_at(
        &history(Phase::Quarantine),
        release(2, Outcome::Done),
        201,
        Events(&["RunnerReleased"]),
    );
    assert_eq!((lease.phase, lease.outcome), (Phase::Quarantine, Some(Outcome::Done)));
}

#[test]
fn teardown_requested_is_still_charged_and_stopped_ends_it() {
    let teardown_phase = history(Phase::Teardown);
    let lease = check(
        &teardown_phase,
        teardown(1, Teardown::Requested),
        Events(&["RunnerTeardownRequested"]),
    );
    assert_eq!((lease.phase, lease.teardown), (Phase::Teardown, Some(Teardown::Requested)));
    assert!(lease.is_charged(), "requested is not proof: still charged");
    let mut requested = teardown_phase.clone();
    requested.push((teardown(1, Teardown::Requested), 20));
    check(&requested, teardown(1, Teardown::Requested), NoChange);
    let lease =
        check(&requested, teardown(1, Teardown::Stopped), Events(&["RunnerTeardownConfirmed"]));
    assert_eq!((lease.phase, lease.teardown), (Phase::Done, Some(Teardown::Stopped)));
    assert!(!lease.is_charged(), "confirmed gone: released");
    // A destroy confirmed in quarantine is proof too; gone again is still gone.
    let lease = check_at(
        &history(Phase::Quarantine),
        teardown(2, Teardown::Stopped),
        201,
        Events(&["RunnerTeardownConfirmed"]),
    );
    assert_eq!(lease.phase, Phase::Failed);
    check(&history(Phase::Done), teardown(1, Teardown::Stopped), NoChange);
    check(
        &history(Phase::Busy),
        teardown(1, Teardown::Stopped),
        invalid(Phase::Busy, "record a teardown"),
    );
}

#[test]
fn a_reap_fails_an_expired_lease_without_compute_and_quarantines_one_that_may_hold_some() {
    // Every fixture lease was last renewed within its first 10 seconds: expired by 200.
    for phase in [Phase::Capacity, Phase::Assigned] {
        check_at(&history(phase), C::Reap, 50, NoChange);
        let lease = check_at(&history(phase), C::Reap, 200, Events(&["RunnerReaped"]));
        assert_eq!((lease.phase, lease.epoch), (Phase::Failed, 2), "{phase:?}");
        assert_eq!(lease.failure_reason, Some(reason("Expired")));
        assert!(!lease.is_charged());
    }
    for phase in [Phase::Launching, Phase::Online, Phase::Busy, Phase::Custody, Phase::Teardown] {
        let lease = check_at(&history(phase), C::Reap, 200, Events(&["RunnerReaped"]));
        assert_eq!((lease.phase, lease.epoch), (Phase::Quarantine, 2), "{phase:?}");
        assert!(lease.is_charged(), "{phase:?}: quarantined, still charged");
        // Whatever its holder still says under the old epoch is fenced.
        let stale = Refused(RunnerError::Fenced { given: 1, current: 2 });
        let mut reaped = history(phase);
        reaped.push((C::Reap, 200));
        check_at(&reaped, heartbeat(1), 201, stale);
    }
    for phase in [Phase::Quarantine, Phase::Done, Phase::Failed] {
        check_at(&history(phase), C::Reap, 900, NoChange);
    }
}

#[test]
fn quarantine_is_left_only_on_proof() {
    let quarantined = history(Phase::Quarantine);
    // Expired at 5 + 90 = 95 (the busy report at second 5); the grace is 300 seconds.
    let expires = replay(&quarantined).expires_at.expect("an expiry");
    let grace_ends = (expires - t(0)).num_seconds() + 300;
    check_at(&quarantined, absent_from("a"), grace_ends - 1, NoChange);
    check_at(&quarantined, absent_from("b"), grace_ends, NoChange);
    let lease =
        check_at(&quarantined, absent_from("a"), grace_ends, Events(&["RunnerQuarantineResolved"]));
    assert_eq!(lease.phase, Phase::Failed);
    assert!(!lease.is_charged());
    // An absence proves nothing of a lease that is not quarantined.
    check_at(&history(Phase::Busy), absent_from("a"), 2_000, NoChange);
    // The job's recorded outcome stands.
    let mut released = quarantined.clone();
    released.push((release(2, Outcome::Done), 201));
    let lease =
        check_at(&released, absent_from("a"), grace_ends, Events(&["RunnerQuarantineResolved"]));
    assert_eq!(lease.phase, Phase::Done);
}

#[test]
fn an_operator_may_force_a_lease_out_of_custody_teardown_or_quarantine() {
    for phase in [Phase::Custody, Phase::Teardown, Phase::Quarantine] {
        let lease = check_at(&history(phase), force(), 210, Events(&["RunnerForceReleased"]));
        assert!(lease.phase.is_terminal(), "{phase:?}");
    }
    check(&history(Phase::Done), force(), NoChange);
    check(&history(Phase::Busy), force(), invalid(Phase::Busy, "be force-released"));
}

#[test]
fn a_re_registration_of_its_node_bumps_the_epoch() {
    let lease = check(&history(Phase::Busy), reregistered("a"), Events(&["RunnerEpochBumped"]));
    assert_eq!(lease.epoch, 2);
    let mut bumped = history(Phase::Busy);
    bumped.push((reregistered("a"), 20));
    check(&bumped, heartbeat(1), Refused(RunnerError::Fenced { given: 1, current: 2 }));
    check(&history(Phase::Busy), reregistered("b"), NoChange);
    check(&history(Phase::Assigned), reregistered("a"), NoChange);
    let mut ended = history(Phase::Launching);
    ended.push((release(1, Outcome::Failed), 10));
    ended.push((teardown(1, Teardown::Stopped), 11));
    check(&ended, reregistered("a"), NoChange);
}

#[test]
fn capacity_is_charged_from_the_assignment_until_the_end() {
    for phase in Phase::ALL {
        let charged = (Phase::Assigned..=Phase::Quarantine).contains(&phase);
        assert_eq!(phase.is_charged(), charged, "{phase:?}");
        assert_eq!(phase.is_terminal(), matches!(phase, Phase::Done | Phase::Failed));
    }
}
