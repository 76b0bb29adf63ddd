//! Givens for the rental's tests: terms, receipts, observations, and the histories that put
//! a rental in each state. A history is commands with the second each was decided at.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_domain::node::NodeId;
use leasehold_domain::rental::Booking;
use leasehold_domain::rental::{
    Bootstrap, CapacityObservation, CapacityReceipt, CapacityState, CapacitySupport, ConnectionId,
    IdempotentProvision, NativeRef, OfferId, OwnershipToken, Pricing, Rental, RentalCommand,
    RentalError, RentalId, RentalTerms, Resources, TerminateCause,
};
use leasehold_domain::run::{BookingId, RunId};
use leasehold_domain::values::OperationId;
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

pub fn rental_id() -> RentalId {
    RentalId(Uuid::from_u128(7))
}

pub fn node(generation: u64) -> NodeId {
    NodeId(Uuid::from_u128(100 + u128::from(generation)))
}

pub fn op(n: u128) -> OperationId {
    OperationId(Uuid::from_u128(1_000 + n))
}

/// Everything a provider can do.
pub fn full_support() -> CapacitySupport {
    CapacitySupport {
        stop: true,
        resume: true,
        persistent_disk: true,
        spot: true,
        exact_pricing: true,
        idempotent_provision: IdempotentProvision::OperationKey,
        list_owned: true,
        observe_after_terminate: false,
    }
}

/// A provider that can only provision and terminate.
pub fn bare_support() -> CapacitySupport {
    CapacitySupport {
        stop: false,
        resume: false,
        persistent_disk: false,
        spot: false,
        exact_pricing: false,
        idempotent_provision: IdempotentProvision::None,
        list_owned: true,
        observe_after_terminate: true,
    }
}

pub fn terms(support: CapacitySupport) -> RentalTerms {
    RentalTerms {
        rental: rental_id(),
        connection: ConnectionId::parse("connection", "sim-eu").expect("valid"),
        offer: OfferId::parse("offer", "gpu-a100-1x").expect("valid"),
        resources: Resources { cpu_millis: 8_000, memory_mb: 32_768, disk_gb: 200, gpus: 1 },
        interruptible: false,
        max_lifetime_seconds: 86_400,
        support,
        bootstrap: Bootstrap {
            control_plane_url: "https://leasehold.local".into(),
            agent_version: "1.0.0".into(),
        },
    }
}

pub fn provision(support: CapacitySupport) -> RentalCommand {
    RentalCommand::Provision {
        terms: terms(support),
        ownership: OwnershipToken("own-7".into()),
        node: node(1),
        operation: op(1),
    }
}

pub fn native() -> NativeRef {
    NativeRef::parse("native", "i-0abc").expect("valid")
}

pub fn receipt(state: CapacityState, interruptible: bool) -> CapacityReceipt {
    CapacityReceipt {
        native_ref: native(),
        state,
        accepted_at: t(1),
        duplicate: false,
        interruptible,
        pricing: Pricing { currency: "USD".into(), micros_per_hour: 1_250_000, exact: true },
    }
}

pub fn accept(generation: u64, state: CapacityState) -> RentalCommand {
    RentalCommand::Accept { generation, receipt: receipt(state, false) }
}

/// The provider's look at `second` (its own clock says the same), asked under generation 1.
pub fn seen(state: CapacityState, second: i64) -> RentalCommand {
    seen_in(1, state, second)
}

/// The provider's look at `second`, asked under `generation`.
pub fn seen_in(generation: u64, state: CapacityState, second: i64) -> RentalCommand {
    RentalCommand::Observe {
        generation,
        observation: CapacityObservation {
            native_ref: native(),
            state,
            state_since: Some(t(second - 1)),
            observed_at: t(second),
            interrupted: false,
        },
    }
}

pub fn interrupted(state: CapacityState, second: i64) -> RentalCommand {
    let RentalCommand::Observe { generation, mut observation } = seen(state, second) else {
        unreachable!()
    };
    observation.interrupted = true;
    RentalCommand::Observe { generation, observation }
}

pub fn stop(generation: u64) -> RentalCommand {
    RentalCommand::Stop { generation, operation: op(2) }
}

pub fn resume(generation: u64) -> RentalCommand {
    RentalCommand::Resume { generation, node: node(generation + 1), operation: op(3) }
}

pub fn terminate(generation: u64) -> RentalCommand {
    RentalCommand::Terminate { generation, cause: TerminateCause::Tenant, operation: op(4) }
}

pub fn booking(n: u128) -> Booking {
    Booking { booking: BookingId(Uuid::from_u128(500 + n)), run: RunId(Uuid::from_u128(600 + n)) }
}

pub fn book(generation: u64, n: u128) -> RentalCommand {
    RentalCommand::Book { generation, booking: booking(n) }
}

pub type History = Vec<(RentalCommand, i64)>;

pub fn requested_with(support: CapacitySupport) -> History {
    vec![(provision(support), 0)]
}

pub fn requested() -> History {
    requested_with(full_support())
}

pub fn starting() -> History {
    [requested(), vec![(accept(1, CapacityState::Requested), 1)]].concat()
}

pub fn active_with(support: CapacitySupport) -> History {
    [
        requested_with(support),
        vec![(accept(1, CapacityState::Requested), 1), (seen(CapacityState::Active, 10), 10)],
    ]
    .concat()
}

pub fn active() -> History {
    active_with(full_support())
}

pub fn stopping() -> History {
    [active(), vec![(stop(1), 20)]].concat()
}

pub fn stopped() -> History {
    [stopping(), vec![(seen(CapacityState::Stopped, 30), 30)]].concat()
}

/// Stopped, then resumed: generation 2, starting.
pub fn resumed() -> History {
    [stopped(), vec![(resume(1), 40)]].concat()
}

pub fn terminating() -> History {
    [active(), vec![(terminate(1), 20)]].concat()
}

pub fn terminated() -> History {
    [terminating(), vec![(seen(CapacityState::Terminated, 30), 30)]].concat()
}

/// The state after deciding each command of `history` at its second.
pub fn replay(history: &[(RentalCommand, i64)]) -> Rental {
    crate::table::replay(history, ctx_at)
}

pub use crate::table::Expect;

/// One row: given a history, when a command is decided at `second`, the expectation holds.
pub fn check_at(
    given: &[(RentalCommand, i64)],
    when: RentalCommand,
    second: i64,
    expect: Expect<RentalError>,
) -> Rental {
    crate::table::check_at(given, (when, second), expect, ctx_at)
}

/// One row decided at second 100.
pub fn check(
    given: &[(RentalCommand, i64)],
    when: RentalCommand,
    expect: Expect<RentalError>,
) -> Rental {
    check_at(given, when, 100, expect)
}
