//! Properties over random command sequences: the generation never decreases, a terminated
//! rental stays terminated, the schedule never holds more than one running and four queued
//! bookings, and a refused command changes nothing.

use leasehold_domain::rental::{
    CapacityState, Rental, RentalCommand, RentalStatus, SCHEDULE_QUEUED_MAX,
};
use leasehold_domain::{Aggregate, Refusal, RefusalKind};
use proptest::prelude::*;

use super::fixtures::*;

fn command() -> impl Strategy<Value = RentalCommand> {
    let generation = 0u64..4;
    let state = proptest::sample::select(CapacityState::ALL.to_vec());
    prop_oneof![
        Just(provision(full_support())),
        (generation.clone(), state.clone()).prop_map(|(g, s)| accept(g, s)),
        (generation.clone(), state.clone(), 1i64..400).prop_map(|(g, s, at)| seen_in(g, s, at)),
        (state, 1i64..400).prop_map(|(s, at)| interrupted(s, at)),
        generation.clone().prop_map(stop),
        generation.clone().prop_map(resume),
        generation.clone().prop_map(terminate),
        generation.clone().prop_map(|generation| RentalCommand::NotFound { generation }),
        (generation, 1u128..8).prop_map(|(g, n)| book(g, n)),
        (1u128..8).prop_map(|n| RentalCommand::ReleaseBooking { booking: booking(n).booking }),
    ]
}

proptest! {
    #[test]
    fn generations_never_decrease_and_terminal_states_never_revert(
        commands in proptest::collection::vec(command(), 1..60),
    ) {
        let mut rental = Rental::initial();
        for (i, command) in commands.iter().enumerate() {
            let at = i64::try_from(i).expect("small") * 7;
            let before = rental.clone();
            match rental.decide(command, &ctx_at(at)) {
                Ok(events) => {
                    rental = events.iter().fold(rental, |state, event| state.evolve(event));
                }
                Err(refusal) => {
                    // A refusal appends nothing; a fenced one never looked past the fence.
                    if refusal.kind() == RefusalKind::Fenced {
                        prop_assert_ne!(before.generation, 0);
                    }
                }
            }
            prop_assert!(rental.generation >= before.generation, "{command:?}");
            if before.status == RentalStatus::Terminated {
                prop_assert_eq!(rental.status, RentalStatus::Terminated);
            }
            prop_assert!(rental.schedule.queued.len() <= SCHEDULE_QUEUED_MAX);
            let running = rental.schedule.running.map(|held| held.booking);
            prop_assert!(rental.schedule.queued.iter().all(|held| Some(held.booking) != running));
        }
    }

    #[test]
    fn a_command_stamped_with_another_generation_is_fenced_with_no_event(
        commands in proptest::collection::vec(command(), 1..40),
        stale in 0u64..3,
    ) {
        // Provisioned first, so that every sequence leaves a rental to probe.
        let mut rental = replay(&requested());
        for (i, command) in commands.iter().enumerate() {
            let at = i64::try_from(i).expect("small") * 7;
            if let Ok(events) = rental.decide(command, &ctx_at(at)) {
                rental = events.iter().fold(rental, |state, event| state.evolve(event));
            }
        }
        // Any generation but the rental's: below it, or past it.
        let stale = if stale == rental.generation { stale + 1 } else { stale };
        for probe in [stop(stale), terminate(stale), book(stale, 1)] {
            let refused = rental.decide(&probe, &ctx_at(1_000));
            prop_assert!(
                matches!(refused, Err(ref error) if error.kind() == RefusalKind::Fenced),
                "{probe:?} on generation {}: {refused:?}", rental.generation
            );
        }
    }
}
