//! Properties over random command sequences: once recorded, a run's outcome never changes;
//! a closed run stays closed with an outcome and its cleanup confirmed or not required; and
//! no second attempt is created while a launch is in flight.

use leasehold_domain::Aggregate;
use leasehold_domain::run::{
    Cleanup, Launch, LaunchAnswer, Run, RunCommand, RunStatus, WorkloadPhase,
};
use proptest::prelude::*;

use super::fixtures::*;

fn command() -> impl Strategy<Value = RunCommand> {
    let n = 1u128..4;
    let phase = proptest::sample::select(vec![
        WorkloadPhase::Preparing,
        WorkloadPhase::Created,
        WorkloadPhase::Running,
        WorkloadPhase::Exited,
        WorkloadPhase::Absent,
    ]);
    prop_oneof![
        Just(submit()),
        n.clone().prop_map(book),
        (n.clone(), proptest::sample::select(vec!["offer-a", "offer-b", "offer-c"]))
            .prop_map(|(n, offer)| create(n, offer)),
        n.clone().prop_map(|n| answered(n, LaunchAnswer::Accepted)),
        n.clone().prop_map(|n| answered(n, LaunchAnswer::Indeterminate)),
        n.clone().prop_map(failed),
        (n, phase, proptest::option::of(-1i32..3), 1i64..100)
            .prop_map(|(n, phase, code, at)| look(n, phase, code, at)),
        Just(cancel()),
        Just(cancel_unstoppable()),
        Just(RunCommand::CancelAccepted),
        Just(RunCommand::ConfirmCleanup),
        Just(RunCommand::GiveUp { reason: reason("NoCapacity") }),
        (101u128..103).prop_map(retired),
    ]
}

proptest! {
    #[test]
    fn an_outcome_never_changes_and_closed_is_final(
        commands in proptest::collection::vec(command(), 1..60),
    ) {
        let mut run = Run::initial();
        for (i, command) in commands.iter().enumerate() {
            let before = run.clone();
            if let Ok(events) = run.decide(command, &ctx_at(i64::try_from(i).expect("small"))) {
                run = events.iter().fold(run, |state, event| state.evolve(event));
            }
            if before.outcome.is_some() {
                prop_assert_eq!(run.outcome, before.outcome, "{:?}", command);
                prop_assert_eq!(run.exit_code, before.exit_code);
            }
            if before.status == RunStatus::Closed {
                prop_assert_eq!(run.status, RunStatus::Closed);
            }
            if run.status == RunStatus::Closed {
                prop_assert!(run.outcome.is_some());
                prop_assert!(matches!(run.cleanup, Some(Cleanup::Confirmed | Cleanup::NotRequired)));
            }
            let in_flight = run.attempts.iter().filter(|attempt| attempt.launch != Launch::Failed).count();
            prop_assert!(in_flight <= 1, "two launches in flight: {:?}", run.attempts);
        }
    }
}
