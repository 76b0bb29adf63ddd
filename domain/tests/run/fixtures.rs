//! Givens for the run's tests: terms, bookings, attempts, node looks, and the histories that
//! put a run in each state. A history is commands with the second each was decided at.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_domain::node::{ManifestDigest, NodeId};
use leasehold_domain::rental::{OfferId, RentalId};
use leasehold_domain::run::{
    AttemptId, BookingId, LaunchAnswer, Run, RunBooking, RunCommand, RunError, RunId, RunTerms,
    WorkloadObservation, WorkloadPhase,
};
use leasehold_domain::values::{OperationId, Reason};
use leasehold_domain::{Actor, Aggregate, Context, DomainEvent, TenantId};
use uuid::Uuid;

pub fn t(second: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a valid time")
        + TimeDelta::seconds(second)
}

pub fn ctx_at(second: i64) -> Context<()> {
    Context {
        now: t(second),
        tenant: TenantId::parse("acme").expect("valid"),
        actor: Actor { subject: "acme".into(), role: "tenant".into() },
        new_ids: Vec::new(),
        facts: (),
    }
}

pub fn run_id() -> RunId {
    RunId(Uuid::from_u128(600))
}

pub fn submit() -> RunCommand {
    RunCommand::Submit {
        terms: RunTerms {
            run: run_id(),
            manifest_digest: ManifestDigest::parse("d", format!("sha256:{}", "cd".repeat(32)))
                .expect("valid"),
            max_runtime_seconds: 3_600,
        },
    }
}

pub fn booking(n: u128) -> RunBooking {
    RunBooking {
        booking: BookingId(Uuid::from_u128(500 + n)),
        rental: RentalId(Uuid::from_u128(7 + n)),
        generation: 1,
    }
}

pub fn book(n: u128) -> RunCommand {
    RunCommand::Book { booking: booking(n) }
}

pub fn attempt_id(n: u128) -> AttemptId {
    AttemptId(Uuid::from_u128(700 + n))
}

pub fn offer(name: &str) -> OfferId {
    OfferId::parse("offer", name).expect("valid")
}

pub fn create(n: u128, on: &str) -> RunCommand {
    RunCommand::CreateAttempt {
        attempt: attempt_id(n),
        node: NodeId(Uuid::from_u128(101)),
        fencing_token: 1,
        offer: offer(on),
        operation: OperationId(Uuid::from_u128(1_000 + n)),
    }
}

pub fn answered(n: u128, answer: LaunchAnswer) -> RunCommand {
    RunCommand::LaunchAnswered { attempt: attempt_id(n), answer }
}

pub fn reason(text: &str) -> Reason {
    Reason::parse("reason", text).expect("valid")
}

pub fn failed(n: u128) -> RunCommand {
    answered(n, LaunchAnswer::Failed { reason: reason("ImagePullFailed") })
}

pub fn look(n: u128, phase: WorkloadPhase, exit_code: Option<i32>, second: i64) -> RunCommand {
    RunCommand::Observe {
        observation: WorkloadObservation {
            run: run_id(),
            attempt: attempt_id(n),
            phase,
            // The node's clock, hours ahead: kept, never used to order anything.
            observed_at: t(second) + TimeDelta::hours(5),
            started_at: None,
            finished_at: None,
            exit_code,
            oom_killed: false,
        },
        received_at: t(second),
    }
}

pub type History = Vec<(RunCommand, i64)>;

pub fn requested() -> History {
    vec![(submit(), 0)]
}

pub fn booked() -> History {
    [requested(), vec![(book(1), 1)]].concat()
}

pub fn launching() -> History {
    [booked(), vec![(create(1, "offer-a"), 2)]].concat()
}

pub fn indeterminate() -> History {
    [launching(), vec![(answered(1, LaunchAnswer::Indeterminate), 3)]].concat()
}

pub fn running() -> History {
    [launching(), vec![(answered(1, LaunchAnswer::Accepted), 3)]].concat()
}

/// Exited 0: succeeded, cleanup pending.
pub fn finished() -> History {
    [running(), vec![(look(1, WorkloadPhase::Exited, Some(0), 10), 10)]].concat()
}

pub fn closed() -> History {
    [finished(), vec![(look(1, WorkloadPhase::Absent, None, 20), 20)]].concat()
}

/// The state after deciding each command of `history` at its second; every one must be
/// accepted.
pub fn replay(history: &[(RunCommand, i64)]) -> Run {
    history.iter().fold(Run::initial(), |run, (command, second)| {
        let events = run.decide(command, &ctx_at(*second)).expect("a history that is accepted");
        events.iter().fold(run, |run, event| run.evolve(event))
    })
}

#[derive(Debug)]
pub enum Expect {
    /// These event types, in order.
    Events(&'static [&'static str]),
    /// Accepted with nothing to append.
    NoChange,
    /// Refused with this error.
    Refused(RunError),
}

/// One row: given a history, when a command is decided at second 50, the expectation holds.
/// Returns the state after the new events.
pub fn check(given: &[(RunCommand, i64)], when: RunCommand, expect: Expect) -> Run {
    let before = replay(given);
    let decided = before.decide(&when, &ctx_at(50));
    match (&expect, &decided) {
        (Expect::Events(types), Ok(events)) => {
            let got: Vec<&str> = events.iter().map(DomainEvent::event_type).collect();
            assert_eq!(&got, types, "{when:?} on {:?}", before.status);
        }
        (Expect::NoChange, Ok(events)) => {
            assert!(events.is_empty(), "{when:?} should change nothing, got {events:?}");
        }
        (Expect::Refused(error), Err(got)) => assert_eq!(got, error, "{when:?}"),
        _ => panic!("{when:?} on {:?}: expected {expect:?}, got {decided:?}", before.status),
    }
    decided.unwrap_or_default().iter().fold(before, |run, event| run.evolve(event))
}
