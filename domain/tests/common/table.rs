//! The transition-table test of any aggregate: a history of commands, each decided at its
//! second, then one more command whose answer is checked against an expectation. Each kind's
//! fixtures give it their context (`ctx_at`); a new kind's table tests need nothing else.
//! Each test binary includes it and uses a part of it.
#![allow(dead_code)]

use leasehold_domain::{Aggregate, Context, DomainEvent};

/// What one more command must answer.
#[derive(Debug)]
pub enum Expect<E> {
    /// These event types, in order.
    Events(&'static [&'static str]),
    /// Accepted with nothing to append.
    NoChange,
    /// Accepted, whatever it appends.
    Accepted,
    /// Refused with this error.
    Refused(E),
}

/// The state after deciding each command of `history` at its second; every one must be
/// accepted.
pub fn replay<A: Aggregate>(
    history: &[(A::Command, i64)],
    ctx_at: impl Fn(i64) -> Context<A::Facts>,
) -> A {
    history.iter().fold(A::initial(), |state, (command, second)| {
        let events = state.decide(command, &ctx_at(*second)).expect("a history that is accepted");
        events.iter().fold(state, |state, event| state.evolve(event))
    })
}

/// One row: given a history, when a command is decided at `second`, the expectation holds.
/// Returns the state after the new events.
pub fn check_at<A>(
    given: &[(A::Command, i64)],
    (when, second): (A::Command, i64),
    expect: Expect<A::Error>,
    ctx_at: impl Fn(i64) -> Context<A::Facts>,
) -> A
where
    A: Aggregate + std::fmt::Debug,
    A::Command: std::fmt::Debug,
    A::Event: std::fmt::Debug,
    A::Error: PartialEq + std::fmt::Debug,
{
    let before: A = replay(given, &ctx_at);
    let decided = before.decide(&when, &ctx_at(second));
    match (&expect, &decided) {
        (Expect::Events(types), Ok(events)) => {
            let got: Vec<&str> = events.iter().map(DomainEvent::event_type).collect();
            assert_eq!(&got, types, "{when:?} on {before:?}");
        }
        (Expect::NoChange, Ok(events)) => {
            assert!(events.is_empty(), "{when:?} should change nothing, got {events:?}");
        }
        (Expect::Accepted, Ok(_)) => {}
        (Expect::Refused(error), Err(got)) => assert_eq!(got, error, "{when:?}"),
        _ => panic!("{when:?} on {before:?}: expected {expect:?}, got {decided:?}"),
    }
    decided.unwrap_or_default().iter().fold(before, |state, event| state.evolve(event))
}
