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
use leasehold_domain::{Actor, Context, TenantId};
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

/// Node 101 (every attempt's here), or another, is retired.
pub fn retired(node: u128) -> RunCommand {
    RunCommand::NodeRetired { node: NodeId(Uuid::from_u128(node)) }
}

/// A cancel whose attempt's node can take the stop (fencing token 1).
pub fn cancel() -> RunCommand {
    RunCommand::Cancel {
        stop: Some(leasehold_domain::run::StopOrder {
            fencing_token: 1,
            operation: leasehold_domain::values::OperationId(uuid::Uuid::from_u128(900)),
        }),
    }
}

/// A cancel while the attempt's node can take no order.
pub fn cancel_unstoppable() -> RunCommand {
    RunCommand::Cancel { stop: None }
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
        node: NodeId(Uuid::from_u128(101)),
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

/// The state after deciding each command of `history` at its second.
pub fn replay(history: &[(RunCommand, i64)]) -> Run {
    crate::table::replay(history, ctx_at)
}

pub use crate::table::Expect;

/// One row: given a history, when a command is decided at `second`, the expectation holds.
pub fn check_at(
    given: &[(RunCommand, i64)],
    when: RunCommand,
    second: i64,
    expect: Expect<RunError>,
) -> Run {
    crate::table::check_at(given, (when, second), expect, ctx_at)
}

/// One row decided at second 50.
pub fn check(given: &[(RunCommand, i64)], when: RunCommand, expect: Expect<RunError>) -> Run {
    check_at(given, when, 50, expect)
}
