//! The run's transition table, row by row (the doc comment of `domain/src/run.rs`): the
//! first terminal fact wins, exit codes count only from `exited`, `absent` is never an exit,
//! an indeterminate launch forbids another until reconciled, a replacement excludes the
//! failed offer, and a run closes only with an outcome and its cleanup settled; then the
//! effects on the schedule and the node, and properties over random command sequences.

mod fixtures;
mod properties;
#[path = "../common/table.rs"]
mod table;

use fixtures::*;
use leasehold_domain::Aggregate;
use leasehold_domain::run::{
    Cleanup, LaunchAnswer, Outcome, RunCommand as C, RunEffect, RunError, RunStatus as S,
    WorkloadPhase as P, run_effects,
};

use Expect::{Events, NoChange, Refused};

fn invalid(status: &'static str, command: &'static str) -> Expect<RunError> {
    Refused(RunError::InvalidState { status, command })
}

#[test]
fn submit_and_book() {
    let run = check(&[], submit(), Events(&["RunRequested"]));
    assert_eq!(run.status, S::Requested);
    check(&requested(), submit(), NoChange);
    check(&[], book(1), Refused(RunError::NotFound));
    let run = check(&requested(), book(1), Events(&["RunBookingDecided"]));
    assert_eq!((run.status, run.booking), (S::Booked, Some(booking(1))));
    check(&booked(), book(1), NoChange);
    check(&booked(), book(2), invalid("booked", "book"));
    // The same id with other terms is another run.
    let mut other = submit();
    if let C::Submit { terms } = &mut other {
        terms.max_runtime_seconds += 1;
    }
    check(&booked(), other, Refused(RunError::AlreadyExists));
}

#[test]
fn an_attempt_records_its_launch_intent_before_the_order() {
    let run = check(
        &booked(),
        create(1, "offer-a"),
        Events(&["RunBookingDispatched", "RunAttemptCreated", "RunLaunchIntentRecorded"]),
    );
    assert_eq!(run.status, S::Launching);
    check(&launching(), create(1, "offer-a"), NoChange);
    // Never two launches at once.
    check(&launching(), create(2, "offer-b"), invalid("launching", "create an attempt"));
    check(&running(), create(2, "offer-b"), invalid("running", "create an attempt"));
    check(&requested(), create(1, "offer-a"), invalid("requested", "create an attempt"));
}

#[test]
fn the_launch_is_admitted_by_the_rental_and_effected_on_the_node_in_the_same_append() {
    let before = replay(&booked());
    let events = before.decide(&create(1, "offer-a"), &ctx_at(2)).expect("accepted");
    let effects = run_effects(&before, &events);
    assert!(
        matches!(
            effects.as_slice(),
            [RunEffect::AdmitAttempt { .. }, RunEffect::OrderLaunch { fencing_token: 1, .. }]
        ),
        "{effects:?}"
    );
    let before = replay(&requested());
    let events = before.decide(&book(1), &ctx_at(2)).expect("accepted");
    assert_eq!(run_effects(&before, &events), vec![RunEffect::Book { booking: booking(1) }]);
}

#[test]
fn an_indeterminate_launch_forbids_another_until_reconciled() {
    let run = check(
        &launching(),
        answered(1, LaunchAnswer::Indeterminate),
        Events(&["RunLaunchIndeterminate"]),
    );
    assert_eq!(run.status, S::Indeterminate);
    check(&indeterminate(), create(2, "offer-b"), Refused(RunError::LaunchIndeterminate));
    check(
        &indeterminate(),
        C::GiveUp { reason: reason("NoCapacity") },
        invalid("indeterminate", "give up"),
    );
    // Reconciled: applied after all, or never applied.
    let run = check(
        &indeterminate(),
        answered(1, LaunchAnswer::Accepted),
        Events(&["RunLaunchAccepted"]),
    );
    assert_eq!(run.status, S::Running);
    let run = check(&indeterminate(), failed(1), Events(&["RunLaunchFailed"]));
    assert_eq!(run.status, S::Booked);
    // Shown never applied: nothing ran, so a relaunch may go to the same offer.
    let not_applied = answered(1, LaunchAnswer::NotApplied);
    let run = check(&indeterminate(), not_applied.clone(), Events(&["RunLaunchNotApplied"]));
    assert_eq!(run.status, S::Booked);
    assert!(run.excluded_offers.is_empty(), "the offer is not excluded");
    let relaunchable = [indeterminate(), vec![(not_applied.clone(), 41)]].concat();
    check(
        &relaunchable,
        create(2, "offer-a"),
        Events(&["RunAttemptCreated", "RunLaunchIntentRecorded"]),
    );
    check(&relaunchable, not_applied, NoChange);
    // A look showing the workload reconciles it too.
    let run = check(
        &indeterminate(),
        look(1, P::Running, None, 40),
        Events(&["RunExternalStateObserved", "RunLaunchAccepted"]),
    );
    assert_eq!(run.status, S::Running);
    // Absent is no proof either way.
    let run = check(
        &indeterminate(),
        look(1, P::Absent, None, 40),
        Events(&["RunExternalStateObserved"]),
    );
    assert_eq!(run.status, S::Indeterminate);
}

#[test]
fn a_replacement_attempt_excludes_the_failed_offer() {
    let failed_once = [launching(), vec![(failed(1), 3)]].concat();
    check(&failed_once, create(2, "offer-a"), Refused(RunError::OfferExcluded));
    check(
        &failed_once,
        create(2, "offer-b"),
        Events(&["RunAttemptCreated", "RunLaunchIntentRecorded"]),
    );
    // Rebooking elsewhere releases the previous booking.
    let before = replay(&failed_once);
    let events = before.decide(&book(2), &ctx_at(5)).expect("accepted");
    assert_eq!(
        run_effects(&before, &events),
        vec![
            RunEffect::ReleaseBooking { booking: booking(1) },
            RunEffect::Book { booking: booking(2) }
        ]
    );
    let run = check(
        &failed_once,
        C::GiveUp { reason: reason("NoCapacity") },
        Events(&["RunOutcomeRecorded", "RunClosed"]),
    );
    assert_eq!((run.outcome, run.cleanup), (Some(Outcome::Failed), Some(Cleanup::NotRequired)));
}

#[test]
fn launch_answers_are_settled_once() {
    check(&running(), answered(1, LaunchAnswer::Accepted), NoChange);
    check(&running(), answered(1, LaunchAnswer::Indeterminate), NoChange);
    check(&running(), failed(1), Refused(RunError::ReportContradicts));
    check(&launching(), answered(9, LaunchAnswer::Accepted), Refused(RunError::NoSuchAttempt));
}

#[test]
fn an_exit_code_counts_only_in_phase_exited() {
    let run =
        check(&running(), look(1, P::Running, Some(0), 10), Events(&["RunExternalStateObserved"]));
    assert_eq!((run.outcome, run.status), (None, S::Running));
    let run =
        check(&running(), look(1, P::Absent, None, 10), Events(&["RunExternalStateObserved"]));
    assert_eq!(run.outcome, None, "absent is not an exit");
    let run = check(
        &running(),
        look(1, P::Exited, Some(3), 10),
        Events(&["RunExternalStateObserved", "RunOutcomeRecorded", "RunCleanupRequested"]),
    );
    assert_eq!(
        (run.outcome, run.exit_code, run.status),
        (Some(Outcome::Failed), Some(3), S::Finished)
    );
    let run = check(
        &running(),
        look(1, P::Exited, Some(0), 10),
        Events(&["RunExternalStateObserved", "RunOutcomeRecorded", "RunCleanupRequested"]),
    );
    assert_eq!(run.outcome, Some(Outcome::Succeeded));
}

#[test]
fn the_first_terminal_fact_wins() {
    let run =
        check(&finished(), look(1, P::Exited, Some(1), 15), Events(&["RunExternalStateObserved"]));
    assert_eq!((run.outcome, run.exit_code), (Some(Outcome::Succeeded), Some(0)));
    // A cancel after the exit changes nothing, nor does its stop being applied.
    check(&finished(), cancel(), NoChange);
    let cancelled = [running(), vec![(cancel(), 5)]].concat();
    let exited = [cancelled.clone(), vec![(look(1, P::Exited, Some(0), 10), 10)]].concat();
    check(&exited, C::CancelAccepted, NoChange);
    let run = check(
        &cancelled,
        C::CancelAccepted,
        Events(&["RunCancelAccepted", "RunOutcomeRecorded", "RunCleanupRequested"]),
    );
    assert_eq!(run.outcome, Some(Outcome::Cancelled));
    let after = [cancelled, vec![(C::CancelAccepted, 6)]].concat();
    let run = check(&after, look(1, P::Exited, Some(0), 10), Events(&["RunExternalStateObserved"]));
    assert_eq!(run.outcome, Some(Outcome::Cancelled));
}

#[test]
fn cancel_before_a_launch_closes_at_once_and_after_one_stops_it() {
    for history in [requested(), booked()] {
        let run = check(
            &history,
            cancel(),
            Events(&["RunCancelRequested", "RunOutcomeRecorded", "RunClosed"]),
        );
        assert_eq!((run.status, run.cleanup), (S::Closed, Some(Cleanup::NotRequired)));
    }
    let before = replay(&running());
    let events = before.decide(&cancel(), &ctx_at(5)).expect("accepted");
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(run_effects(&before, &events).as_slice(), [RunEffect::OrderStop { .. }]));
    let cancelled = [running(), vec![(cancel(), 5)]].concat();
    check(&cancelled, cancel(), NoChange);
    check(&running(), C::CancelAccepted, invalid("running", "accept a cancel never asked"));
    // A node that can take no order now gets the stop when a cancel comes again.
    let unstoppable = [running(), vec![(cancel_unstoppable(), 5)]].concat();
    check(&unstoppable, C::CancelAccepted, invalid("running", "accept a stop never ordered"));
    check(&unstoppable, cancel_unstoppable(), NoChange);
    check(&unstoppable, cancel(), Events(&["RunStopOrdered"]));
    // A stop the node refused (or never applied) is ordered again, under a new operation.
    let stop = leasehold_domain::values::OperationId(uuid::Uuid::from_u128(900));
    let failed_stop = C::StopFailed { operation: stop };
    let run = check(&cancelled, failed_stop.clone(), Events(&["RunStopFailed"]));
    assert_eq!((run.stop, run.stop_failures, run.status), (None, 1, S::Running));
    let other = C::StopFailed {
        operation: leasehold_domain::values::OperationId(uuid::Uuid::from_u128(901)),
    };
    check(&cancelled, other, NoChange);
    let refused_once = [cancelled.clone(), vec![(failed_stop.clone(), 6)]].concat();
    check(&refused_once, failed_stop, NoChange);
    check(&refused_once, cancel(), Events(&["RunStopOrdered"]));
    // A cancel while launching whose launch then fails never launched anything.
    let cancelled = [launching(), vec![(cancel(), 5)]].concat();
    let run = check(
        &cancelled,
        failed(1),
        Events(&["RunLaunchFailed", "RunOutcomeRecorded", "RunClosed"]),
    );
    assert_eq!(run.outcome, Some(Outcome::Cancelled));
    check(&cancelled, create(2, "offer-b"), invalid("launching", "create an attempt"));
}

#[test]
fn a_run_closes_with_an_outcome_and_its_cleanup_settled() {
    let run = check(
        &finished(),
        look(1, P::Absent, None, 20),
        Events(&["RunExternalStateObserved", "RunCleanupConfirmed", "RunClosed"]),
    );
    assert_eq!((run.status, run.cleanup), (S::Closed, Some(Cleanup::Confirmed)));
    let run = check(
        &finished(),
        C::FailCleanup { reason: reason("StopTimedOut") },
        Events(&["RunCleanupFailed"]),
    );
    assert_eq!((run.status, run.cleanup), (S::Finished, Some(Cleanup::Blocked)));
    check(&finished(), C::ConfirmCleanup, Events(&["RunCleanupConfirmed", "RunClosed"]));
    check(&running(), C::ConfirmCleanup, invalid("running", "confirm its cleanup"));
    // Closing takes the booking off the schedule.
    let before = replay(&finished());
    let events = before.decide(&C::ConfirmCleanup, &ctx_at(30)).expect("accepted");
    assert_eq!(
        run_effects(&before, &events),
        vec![RunEffect::ReleaseBooking { booking: booking(1) }]
    );
}

#[test]
fn a_run_ends_with_the_node_its_attempt_was_launched_on() {
    // Launched (answered or not) and the machine's generation ended: failed as NodeRetired,
    // and cleaned up by the machine's end.
    for history in [launching(), indeterminate(), running()] {
        let run = check(
            &history,
            retired(101),
            Events(&["RunNodeRetired", "RunOutcomeRecorded", "RunCleanupConfirmed", "RunClosed"]),
        );
        assert_eq!((run.status, run.outcome), (S::Closed, Some(Outcome::Failed)));
        assert_eq!(run.failure, Some(reason("NodeRetired")));
        assert_eq!(run.cleanup, Some(Cleanup::Confirmed));
        // Another node's retirement is nothing to it.
        check(&history, retired(102), NoChange);
    }
    // A cancel asked: cancelled. An outcome recorded: it stands, and the cleanup is done.
    let cancelled = [running(), vec![(cancel_unstoppable(), 5)]].concat();
    let run = check(
        &cancelled,
        retired(101),
        Events(&["RunNodeRetired", "RunOutcomeRecorded", "RunCleanupConfirmed", "RunClosed"]),
    );
    assert_eq!(run.outcome, Some(Outcome::Cancelled));
    let run = check(
        &finished(),
        retired(101),
        Events(&["RunNodeRetired", "RunCleanupConfirmed", "RunClosed"]),
    );
    assert_eq!((run.outcome, run.exit_code), (Some(Outcome::Succeeded), Some(0)));
    // Nothing launched there: the booking waits for the next generation's node.
    let failed_launch = [launching(), vec![(failed(1), 3)]].concat();
    check(&failed_launch, retired(101), NoChange);
    // Seen exiting after all: its outcome stands, and the machine's end cleans it up.
    let exited_anyway = [failed_launch, vec![(look(1, P::Exited, Some(4), 10), 10)]].concat();
    assert_eq!(replay(&exited_anyway).status, S::Finished);
    let run = check(
        &exited_anyway,
        retired(101),
        Events(&["RunNodeRetired", "RunCleanupConfirmed", "RunClosed"]),
    );
    assert_eq!((run.outcome, run.exit_code), (Some(Outcome::Failed), Some(4)));
    check(&booked(), retired(101), NoChange);
    check(&closed(), retired(101), NoChange);
    // Closing takes the booking off the schedule.
    let before = replay(&running());
    let events = before.decide(&retired(101), &ctx_at(30)).expect("accepted");
    assert_eq!(
        run_effects(&before, &events),
        vec![RunEffect::ReleaseBooking { booking: booking(1) }]
    );
}

#[test]
fn a_closed_run_takes_late_reports_quietly() {
    check(&closed(), look(1, P::Exited, Some(9), 60), NoChange);
    check(&closed(), answered(1, LaunchAnswer::Accepted), NoChange);
    check(&closed(), cancel(), NoChange);
    check(&closed(), C::ConfirmCleanup, NoChange);
    check(&closed(), book(2), invalid("closed", "book"));
    assert!(replay(&closed()).is_terminal());
}

#[test]
fn only_the_attempts_own_node_reports_on_it() {
    let mut other = look(1, P::Exited, Some(0), 10);
    if let C::Observe { node, .. } = &mut other {
        *node = leasehold_domain::node::NodeId(uuid::Uuid::from_u128(999));
    }
    check(&running(), other, Refused(RunError::NoSuchAttempt));
}

#[test]
fn a_nodes_clock_orders_nothing() {
    // The node's clock jumps back a day between its looks: what it says is taken in the
    // order Leasehold received it, and each look keeps Leasehold's receipt time.
    let mut exited = look(1, P::Exited, Some(0), 20);
    if let C::Observe { observation, .. } = &mut exited {
        observation.observed_at = t(20) - chrono::TimeDelta::days(1);
    }
    let seen = [running(), vec![(look(1, P::Running, None, 10), 10)]].concat();
    let before = replay(&seen);
    let events = before.decide(&exited, &ctx_at(20)).expect("accepted");
    match events.first() {
        Some(leasehold_domain::run::RunEvent::RunExternalStateObserved {
            observation,
            received_at,
        }) => {
            assert_eq!(*received_at, t(20), "Leasehold's receipt");
            assert_eq!(observation.observed_at, t(20) - chrono::TimeDelta::days(1), "kept");
        }
        other => panic!("expected the look first, got {other:?}"),
    }
    let run = check_at(
        &seen,
        exited,
        20,
        Events(&["RunExternalStateObserved", "RunOutcomeRecorded", "RunCleanupRequested"]),
    );
    assert_eq!((run.outcome, run.exit_code), (Some(Outcome::Succeeded), Some(0)));
}

#[test]
fn a_repeated_look_is_not_recorded_twice() {
    let seen = [running(), vec![(look(1, P::Running, None, 10), 10)]].concat();
    check(&seen, look(1, P::Running, None, 11), NoChange);
}

#[test]
fn a_cancel_while_the_launch_is_out_stops_only_once_the_launch_is_accepted() {
    // A stop sent beside a launch whose answer is out could be applied before the launch
    // and stop nothing: the run would close while its workload starts.
    for history in [launching(), indeterminate()] {
        let before = replay(&history);
        let events = before.decide(&cancel(), &ctx_at(5)).expect("accepted");
        assert!(run_effects(&before, &events).is_empty(), "no stop beside the launch");
        let cancelled = [history, vec![(cancel(), 5)]].concat();
        check(
            &cancelled,
            C::CancelAccepted,
            Refused(RunError::InvalidState {
                status: replay(&cancelled).status.name(),
                command: "accept a stop never ordered",
            }),
        );
        check(&cancelled, look(1, P::Absent, None, 8), Expect::Accepted);
        assert_ne!(
            replay(&[cancelled.clone(), vec![(look(1, P::Absent, None, 8), 8)]].concat()).status,
            S::Closed
        );
        // Accepted: a cancel again orders the stop, and its application finishes the run.
        let accepted = [cancelled, vec![(answered(1, LaunchAnswer::Accepted), 9)]].concat();
        assert_eq!(replay(&accepted).status, S::Running);
        let stopping = [accepted.clone(), vec![(cancel(), 10)]].concat();
        check(&accepted, cancel(), Events(&["RunStopOrdered"]));
        let run = check(
            &stopping,
            C::CancelAccepted,
            Events(&["RunCancelAccepted", "RunOutcomeRecorded", "RunCleanupRequested"]),
        );
        assert_eq!((run.status, run.outcome), (S::Finished, Some(Outcome::Cancelled)));
    }
}
