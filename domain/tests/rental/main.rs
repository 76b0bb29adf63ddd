//! The rental's transition table, row by row (the doc comment of `domain/src/rental.rs`),
//! with every guard's refusal, the observation table cell by cell, the schedule's bounds and
//! the node effects; then properties over random command sequences.

mod fixtures;
mod properties;
#[path = "../common/table.rs"]
mod table;

use fixtures::*;
use leasehold_domain::rental::{
    CapacityObservation, CapacityState as O, IdempotentProvision, NodeEffect, RentalCommand as C,
    RentalError, RentalStatus as S, SupportError, node_effects,
};
use leasehold_domain::values::OperatorDetail;
use leasehold_domain::{Aggregate, Refusal, RefusalKind};

use Expect::{Events, NoChange, Refused};

fn fenced(given: u64, current: u64) -> Expect<RentalError> {
    Refused(RentalError::Fenced { given, current })
}

fn invalid(status: &'static str, command: &'static str) -> Expect<RentalError> {
    Refused(RentalError::InvalidState { status, command })
}

#[test]
fn provisioning_mints_generation_one_and_its_node() {
    let rental = check(&[], provision(full_support()), Events(&["CapacityRequested"]));
    assert_eq!((rental.status, rental.generation, rental.node), (S::Requested, 1, Some(node(1))));
    assert!(rental.is_charged(), "charged from the provision on");
    check(&requested(), provision(full_support()), NoChange);
    check(&requested(), provision(bare_support()), Refused(RentalError::AlreadyExists));
    assert_eq!(RentalError::AlreadyExists.kind(), RefusalKind::Conflict);
}

#[test]
fn anything_but_a_provision_on_nothing_is_not_found() {
    for command in [accept(1, O::Active), seen(O::Active, 1), stop(1), terminate(1)] {
        check(&[], command, Refused(RentalError::NotFound));
    }
}

#[test]
fn the_receipt_records_what_was_allocated() {
    let rental = check(&requested(), accept(1, O::Requested), Events(&["CapacityAccepted"]));
    assert_eq!(rental.status, S::Starting);
    let allocated = rental.allocated.expect("allocated");
    assert_eq!(allocated.native_ref, native());
    let rental = check(&requested(), accept(1, O::Active), Events(&["CapacityAccepted"]));
    assert_eq!(rental.status, S::Active, "a receipt that says active");
    // Interruptible as allocated may differ from the request.
    let spot = C::Accept { generation: 1, receipt: receipt(O::Requested, true) };
    let rental = check(&requested(), spot, Events(&["CapacityAccepted"]));
    assert!(rental.allocated.expect("allocated").interruptible);
    assert!(!rental.terms.expect("terms").interruptible);
    // The same receipt again is a redelivery; another machine is not.
    check(&starting(), accept(1, O::Active), NoChange);
    let mut other = receipt(O::Active, false);
    other.native_ref = leasehold_domain::rental::NativeRef::parse("n", "i-other").expect("ok");
    check(
        &starting(),
        C::Accept { generation: 1, receipt: other },
        Refused(RentalError::OtherMachine),
    );
    check(&requested(), accept(2, O::Active), fenced(2, 1));
    check(&terminated(), accept(1, O::Active), NoChange);
}

#[test]
fn a_provision_refused_for_good_terminates_and_retires_the_node() {
    let before = replay(&requested());
    let failed = C::FailProvision { generation: 1, detail: OperatorDetail::new("no capacity") };
    let rental = check(&requested(), failed.clone(), Events(&["CapacityProvisionFailed"]));
    assert_eq!(rental.status, S::Terminated);
    assert!(!rental.is_charged());
    let events = before.decide(&failed, &ctx_at(5)).expect("accepted");
    assert_eq!(
        node_effects(&before, &events),
        vec![NodeEffect::Retire { node: node(1), generation: 1 }]
    );
    check(&starting(), failed.clone(), invalid("starting", "fail its provision"));
    // A termination asked before any receipt: the refusal still ends it (nothing to stop
    // charging for); after a receipt it cannot.
    let early = [requested(), vec![(terminate(1), 2)]].concat();
    let rental = check(&early, failed.clone(), Events(&["CapacityProvisionFailed"]));
    assert_eq!(rental.status, S::Terminated);
    check(&terminating(), failed, invalid("terminating", "fail its provision"));
}

#[test]
fn an_observation_before_any_receipt_has_no_machine() {
    check(&requested(), seen(O::Active, 5), Refused(RentalError::NotAccepted));
    let mut other = seen(O::Active, 50);
    if let C::Observe { observation, .. } = &mut other {
        observation.native_ref =
            leasehold_domain::rental::NativeRef::parse("n", "i-x").expect("ok");
    }
    check(&active(), other, Refused(RentalError::OtherMachine));
}

/// The second table of `rental.rs`, cell by cell.
#[test]
fn an_observation_moves_the_rental_as_the_table_says() {
    let histories = [
        ("starting", starting(), S::Starting),
        ("active", active(), S::Active),
        ("stopping", stopping(), S::Stopping),
        ("stopped", stopped(), S::Stopped),
        ("terminating", terminating(), S::Terminating),
    ];
    let expected = |observed: O, from: S| -> S {
        match (observed, from) {
            (O::Terminated, _) => S::Terminated,
            (O::Active, S::Starting | S::Stopped) => S::Active,
            (O::Stopping, S::Active) => S::Stopping,
            (O::Stopped, S::Starting | S::Active | S::Stopping) => S::Stopped,
            _ => from,
        }
    };
    for (name, history, from) in histories {
        for observed in O::ALL {
            let rental = check_at(&history, seen(observed, 200), 200, Expect::Accepted);
            assert_eq!(rental.status, expected(observed, from), "{observed:?} on {name}");
            assert_eq!(rental.observed.expect("recorded").received_at, t(200));
        }
    }
}

#[test]
fn unknown_is_recorded_and_changes_nothing() {
    let rental = check(&active(), seen(O::Unknown, 100), Events(&["CapacityObserved"]));
    assert_eq!(rental.status, S::Active, "rule 10: unknown is never a reason to act");
}

#[test]
fn an_older_look_or_the_same_look_again_is_not_recorded() {
    // Older than the last recorded (second 10) on the provider's clock.
    check(&active(), seen(O::Stopped, 5), NoChange);
    let same = C::Observe {
        generation: 1,
        observation: CapacityObservation {
            native_ref: native(),
            state: O::Active,
            state_since: Some(t(9)),
            observed_at: t(30),
            interrupted: false,
        },
    };
    check_at(&active(), same.clone(), 30, NoChange);
    // A minute after the recorded one, the same look is recorded again.
    check_at(&active(), same, 71, Events(&["CapacityObserved"]));
}

#[test]
fn stop_confirmation_interruption_and_termination_are_distinct_facts() {
    check(&stopping(), seen(O::Stopped, 100), Events(&["CapacityStopped"]));
    let rental = check(&active(), interrupted(O::Stopped, 100), Events(&["CapacityInterrupted"]));
    assert_eq!(rental.status, S::Stopped);
    let rental =
        check(&active(), interrupted(O::Terminated, 100), Events(&["CapacityInterrupted"]));
    assert_eq!(rental.status, S::Terminated);
    // A reclaimed machine's generation ends: its node is retired.
    let before = replay(&active());
    let events = before.decide(&interrupted(O::Terminated, 100), &ctx_at(100)).expect("accepted");
    assert_eq!(
        node_effects(&before, &events),
        vec![NodeEffect::Retire { node: node(1), generation: 1 }]
    );
    let rental = check(&active(), seen(O::Stopped, 100), Events(&["CapacityObserved"]));
    assert_eq!(rental.status, S::Stopped, "stopped without an ask and not interrupted");
    check(&terminating(), seen(O::Terminated, 100), Events(&["CapacityTerminated"]));
    check(&terminated(), seen(O::Active, 100), NoChange);
}

#[test]
fn stop_needs_the_capability_and_the_generation() {
    let rental = check(&active(), stop(1), Events(&["CapacityStopRequested"]));
    assert_eq!(rental.status, S::Stopping);
    check(&stopping(), stop(1), NoChange);
    check(&stopped(), stop(1), NoChange);
    let unsupported = Refused(RentalError::Unsupported { operation: "stop" });
    check(&active_with(bare_support()), stop(1), unsupported);
    assert_eq!(RentalError::Unsupported { operation: "stop" }.kind(), RefusalKind::Unsupported);
    check(&active(), stop(0), fenced(0, 1));
    check(&starting(), stop(1), invalid("starting", "stop"));
}

#[test]
fn resume_starts_a_new_generation_and_retires_the_previous_node() {
    let before = replay(&stopped());
    let events = before.decide(&resume(1), &ctx_at(40)).expect("accepted");
    assert_eq!(
        node_effects(&before, &events),
        vec![
            NodeEffect::Retire { node: node(1), generation: 1 },
            NodeEffect::Invite { node: node(2), generation: 2 },
        ]
    );
    let rental = check(&stopped(), resume(1), Events(&["CapacityResumed"]));
    assert_eq!((rental.status, rental.generation, rental.node), (S::Starting, 2, Some(node(2))));
    // The same resume again is a retry, in any later state.
    check(&resumed(), resume(1), NoChange);
    let running_again = [resumed(), vec![(seen_in(2, O::Active, 50), 50)]].concat();
    check(&running_again, resume(1), NoChange);
    // A command from before the resume is fenced.
    check(&running_again, stop(1), fenced(1, 2));
    check(&running_again, terminate(1), fenced(1, 2));
    check(&running_again, book(1, 1), fenced(1, 2));
    check(&active(), resume(1), invalid("active", "resume"));
}

#[test]
fn a_look_from_before_a_resume_or_the_resume_not_yet_acted_on_stops_nothing() {
    // A look asked under generation 1 that lands after the resume is about the old cycle.
    check(&resumed(), seen_in(1, O::Stopped, 60), fenced(1, 2));
    // Asked under generation 2, the provider still shows the machine stopped since the stop
    // it recorded before the resume (the same `state_since`, its own clock), or does not
    // date it: it has not acted on the resume yet, and the rental stays starting.
    let since = |look: C, state_since: Option<i64>| match look {
        C::Observe { generation, mut observation } => {
            observation.state_since = state_since.map(t);
            C::Observe { generation, observation }
        }
        _ => unreachable!(),
    };
    for state_since in [Some(29), Some(10), None] {
        let look = since(seen_in(2, O::Stopped, 60), state_since);
        let rental = check(&resumed(), look, Events(&["CapacityObserved"]));
        assert_eq!(rental.status, S::Starting, "stopped since {state_since:?}");
    }
    // Stopped since after the stop it recorded: the machine stopped again, a fact.
    let again = since(seen_in(2, O::Stopped, 60), Some(55));
    let rental = check(&resumed(), again, Events(&["CapacityObserved"]));
    assert_eq!(rental.status, S::Stopped);
    // A reclaim is a fact whenever it comes.
    let reclaimed = interrupted(O::Stopped, 60);
    let reclaimed = match reclaimed {
        C::Observe { observation, .. } => C::Observe { generation: 2, observation },
        _ => unreachable!(),
    };
    let rental = check(&resumed(), reclaimed, Events(&["CapacityInterrupted"]));
    assert_eq!(rental.status, S::Stopped);
    let rental = check(&resumed(), seen_in(2, O::Active, 60), Events(&["CapacityObserved"]));
    assert_eq!(rental.status, S::Active);
    // An undated stopped look, recorded, does not replace the recorded stop's date: a later
    // look dated after it is still the fact it is.
    let undated = [resumed(), vec![(since(seen_in(2, O::Stopped, 60), None), 60)]].concat();
    assert_eq!(replay(&undated).stopped_since, replay(&resumed()).stopped_since);
    let rental =
        check(&undated, since(seen_in(2, O::Stopped, 70), Some(65)), Events(&["CapacityObserved"]));
    assert_eq!(rental.status, S::Stopped, "stopped again after the recorded stop");
    // Seen moving after the resume (starting), a stopped look is news, dated or not.
    let moving = [resumed(), vec![(seen_in(2, O::Starting, 60), 60)]].concat();
    let rental =
        check(&moving, since(seen_in(2, O::Stopped, 70), None), Events(&["CapacityObserved"]));
    assert_eq!(rental.status, S::Stopped, "it started, then stopped");
}

#[test]
fn resume_needs_the_capability() {
    let mut stop_only = full_support();
    stop_only.resume = false;
    let history =
        [active_with(stop_only), vec![(stop(1), 20), (seen(O::Stopped, 30), 30)]].concat();
    check(&history, resume(1), Refused(RentalError::Unsupported { operation: "resume" }));
}

#[test]
fn terminate_from_every_live_state_and_idempotent_after() {
    for history in [requested(), starting(), active(), stopping(), stopped()] {
        let rental = check(&history, terminate(1), Events(&["CapacityTerminationRequested"]));
        assert_eq!(rental.status, S::Terminating);
        assert!(rental.is_charged(), "rule 9: charged until confirmed gone");
    }
    check(&terminating(), terminate(1), NoChange);
    check(&terminated(), terminate(1), NoChange);
    let before = replay(&terminating());
    let events = before.decide(&seen(O::Terminated, 30), &ctx_at(30)).expect("accepted");
    assert_eq!(
        node_effects(&before, &events),
        vec![NodeEffect::Retire { node: node(1), generation: 1 }]
    );
}

#[test]
fn not_found_confirms_only_a_termination_at_a_provider_that_cannot_observe_it() {
    // full_support: terminated capacity is unobservable.
    let rental =
        check(&terminating(), C::NotFound { generation: 1 }, Events(&["CapacityTerminated"]));
    assert_eq!(rental.status, S::Terminated);
    let observable = [active_with(bare_support()), vec![(terminate(1), 20)]].concat();
    check(&observable, C::NotFound { generation: 1 }, NoChange);
    // Nor before a receipt named the machine: a provision may still be in flight.
    let unanswered = [requested(), vec![(terminate(1), 5)]].concat();
    check(&unanswered, C::NotFound { generation: 1 }, NoChange);
    // Absence is never proof otherwise.
    for history in [starting(), active(), stopped()] {
        check(&history, C::NotFound { generation: 1 }, NoChange);
    }
}

#[test]
fn the_schedule_holds_one_running_and_four_queued() {
    let rental = check(&active(), book(1, 1), Events(&["RentalBooked"]));
    assert_eq!(rental.schedule.running, Some(booking(1)));
    let mut history = [active(), vec![(book(1, 1), 50)]].concat();
    for n in 2..=5 {
        let rental = check(&history, book(1, n), Events(&["RentalBooked"]));
        assert_eq!(rental.schedule.queued.last(), Some(&booking(n)));
        history.push((book(1, n), 50));
    }
    check(&history, book(1, 6), Refused(RentalError::ScheduleFull));
    check(&history, book(1, 3), NoChange);
    // The running one leaves: the first queued starts.
    let release = C::ReleaseBooking { booking: booking(1).booking };
    let rental = check(
        &history,
        release.clone(),
        Events(&["RentalBookingReleased", "RentalBookingStarted"]),
    );
    assert_eq!(rental.schedule.running, Some(booking(2)));
    assert_eq!(rental.schedule.queued.len(), 3);
    let queued = C::ReleaseBooking { booking: booking(4).booking };
    check(&history, queued, Events(&["RentalBookingReleased"]));
    check(&active(), release, NoChange);
    check(&starting(), book(1, 1), invalid("starting", "book a run"));
}

#[test]
fn an_attempt_is_admitted_only_for_the_running_booking_on_the_rentals_node() {
    let admit = |n, node| C::AdmitAttempt {
        booking: booking(n).booking,
        node,
        attempt: leasehold_domain::run::AttemptId(uuid::Uuid::from_u128(700 + n)),
    };
    let history = [active(), vec![(book(1, 1), 50), (book(1, 2), 50)]].concat();
    let rental = check(&history, admit(1, node(1)), Events(&["RentalAttemptAdmitted"]));
    assert_eq!(rental.schedule.running, Some(booking(1)), "the schedule is unchanged");
    let refused = || invalid("active", "admit an attempt of a booking not running on its node");
    // A queued booking, one never made, or another generation's node.
    check(&history, admit(2, node(1)), refused());
    check(&history, admit(9, node(1)), refused());
    check(&history, admit(1, node(2)), refused());
    // Only an active rental admits one.
    check(&stopping(), admit(1, node(1)), invalid("stopping", "admit an attempt"));
    // A booking made before a stop and resume runs on the resumed generation's node, and
    // an attempt decided before the resume (on the retired node) is refused.
    let resumed = [
        active(),
        vec![(book(1, 1), 11), (book(1, 2), 11), (stop(1), 20)],
        vec![(seen(O::Stopped, 30), 30), (resume(1), 40)],
        vec![(seen_in(2, O::Active, 50), 50)],
    ]
    .concat();
    check(&resumed, admit(1, node(2)), Events(&["RentalAttemptAdmitted"]));
    check(&resumed, admit(1, node(1)), refused());
}

#[test]
fn nothing_queues_behind_interruptible_capacity() {
    let spot = C::Accept { generation: 1, receipt: receipt(O::Active, true) };
    let history = [requested(), vec![(spot, 1), (book(1, 1), 2)]].concat();
    check(&history, book(1, 2), Refused(RentalError::ScheduleFull));
}

#[test]
fn a_terminated_rental_refuses_what_acts_on_capacity() {
    check(&terminated(), stop(1), invalid("terminated", "stop"));
    check(&terminated(), book(1, 1), invalid("terminated", "book a run"));
    check(&terminated(), C::NotFound { generation: 1 }, NoChange);
}

#[test]
fn a_capability_set_is_validated() {
    let mut support = full_support();
    assert_eq!(support.validate(), Ok(()));
    support.idempotent_provision = IdempotentProvision::None;
    support.list_owned = false;
    assert_eq!(support.validate(), Err(SupportError::NoWayToFindLostCapacity));
    let mut support = full_support();
    support.stop = false;
    assert_eq!(support.validate(), Err(SupportError::ResumeWithoutStop));
    support.resume = false;
    assert_eq!(support.validate(), Err(SupportError::PersistentDiskWithoutStop));
    support.persistent_disk = false;
    assert_eq!(support.validate(), Ok(()));
}
