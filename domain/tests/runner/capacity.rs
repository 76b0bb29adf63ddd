//! A tenant's runner capacity, row by row (`domain/src/runner_capacity.rs`), and the
//! capacity effects of a lease's events.

use leasehold_domain::runner::{Outcome, Phase, RunnerLeaseId, RunnerResources, Teardown, Tier};
use leasehold_domain::runner_capacity::{
    Demand, Dimension, RunnerCapacity, RunnerCapacityCommand as C, RunnerCapacityError,
    RunnerLimits, TierLimit, capacity_effect,
};
use leasehold_domain::{Aggregate, Context, Refusal, RefusalKind};
use uuid::Uuid;

use super::fixtures::{self, Expect, history, release, replay, teardown};
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

fn check(given: &[C], when: C, expect: Expect<RunnerCapacityError>) -> RunnerCapacity {
    let given: Vec<(C, i64)> = given.iter().cloned().map(|command| (command, 1)).collect();
    table::check_at(&given, (when, 2), expect, ctx_at)
}

fn lease(n: u128) -> RunnerLeaseId {
    RunnerLeaseId(Uuid::from_u128(n))
}

fn tier(name: &str) -> Tier {
    Tier::parse("tier", name).expect("valid")
}

fn demand(vcpu: u32, tier_name: &str, macos: bool) -> Demand {
    Demand {
        tier: tier(tier_name),
        resources: RunnerResources::new("r", vcpu, u64::from(vcpu) * 2048).expect("valid"),
        macos,
    }
}

fn reserve(n: u128, demand: Demand) -> C {
    C::Reserve { lease: lease(n), demand }
}

fn limits(vcpu: u64, tiers: &[(&str, u32)], macos_slots: u32) -> C {
    let tiers = tiers.iter().map(|(name, max)| TierLimit { tier: tier(name), max: *max }).collect();
    C::SetLimits { limits: RunnerLimits { vcpu, memory_mb: 0, tiers, macos_slots } }
}

#[test]
fn limits_are_set_by_events_and_unchanged_limits_change_nothing() {
    let quota = check(&[], limits(8, &[("linux-4x", 2)], 1), Events(&["RunnerLimitsSet"]));
    assert_eq!(quota.limits.vcpu, 8);
    check(&[limits(8, &[("linux-4x", 2)], 1)], limits(8, &[("linux-4x", 2)], 1), NoChange);
}

#[test]
fn a_reservation_fits_every_dimension_or_is_refused_naming_the_first_that_does_not() {
    let set = limits(8, &[("linux-4x", 2)], 1);
    let quota = check(
        std::slice::from_ref(&set),
        reserve(1, demand(4, "linux-4x", false)),
        Events(&["RunnerCapacityReserved"]),
    );
    assert_eq!((quota.usage.vcpu, quota.usage.memory_mb), (4, 8192));
    let given = [set.clone(), reserve(1, demand(4, "linux-4x", false))];
    let exceeded =
        |dimension, max| Refused(RunnerCapacityError::CapacityExceeded { dimension, max });
    check(&given, reserve(2, demand(5, "linux-2x", false)), exceeded(Dimension::Vcpu, 8));
    let given = [
        set.clone(),
        reserve(1, demand(1, "linux-4x", false)),
        reserve(2, demand(1, "linux-4x", false)),
    ];
    check(
        &given,
        reserve(3, demand(1, "linux-4x", false)),
        exceeded(Dimension::Tier(tier("linux-4x")), 2),
    );
    check(&given, reserve(3, demand(1, "linux-2x", false)), Events(&["RunnerCapacityReserved"]));
    let given = [set, reserve(1, demand(1, "macos-m2", true))];
    check(&given, reserve(2, demand(1, "macos-m2", true)), exceeded(Dimension::MacosSlots, 1));
    let error = RunnerCapacityError::CapacityExceeded { dimension: Dimension::Vcpu, max: 8 };
    assert_eq!(error.kind(), RefusalKind::QuotaExceeded);
}

#[test]
fn no_limits_means_no_limit_and_the_same_reservation_again_is_idempotent() {
    let given = [reserve(1, demand(200, "linux-4x", true))];
    check(&[], reserve(1, demand(200, "linux-4x", true)), Events(&["RunnerCapacityReserved"]));
    check(&given, reserve(1, demand(200, "linux-4x", true)), NoChange);
    check(
        &given,
        reserve(1, demand(2, "linux-4x", true)),
        Refused(RunnerCapacityError::ReservationMismatch),
    );
    assert_eq!(RunnerCapacityError::ReservationMismatch.kind(), RefusalKind::Conflict);
}

#[test]
fn a_release_gives_back_what_the_lease_held_once() {
    let given = [limits(4, &[], 0), reserve(1, demand(4, "linux-4x", false))];
    let quota = check(&given, C::Release { lease: lease(1) }, Events(&["RunnerCapacityReleased"]));
    assert_eq!(quota.usage, Default::default());
    check(&[], C::Release { lease: lease(1) }, NoChange);
    // A lower limit refuses new reservations and touches none held.
    let quota = check(&given, limits(2, &[], 0), Events(&["RunnerLimitsSet"]));
    assert_eq!(quota.usage.vcpu, 4);
}

#[test]
fn a_lease_reserves_at_its_assignment_and_releases_only_at_its_end() {
    let terms = fixtures::terms();
    let at_phase = |phase| replay(&history(phase));
    let effect = |phase, command| {
        let lease = at_phase(phase);
        let events = lease.decide(&command, &fixtures::ctx_at(50)).expect("accepted");
        capacity_effect(&lease, &events)
    };
    let expected_demand =
        Demand { tier: terms.tier.clone(), resources: terms.resources, macos: false };
    assert_eq!(
        effect(Phase::Capacity, fixtures::assign(1, 1)),
        Some(C::Reserve { lease: terms.lease, demand: expected_demand })
    );
    assert_eq!(effect(Phase::Busy, release(1, Outcome::Done)), None, "teardown is still charged");
    assert_eq!(effect(Phase::Teardown, teardown(1, Teardown::Requested)), None);
    assert_eq!(
        effect(Phase::Teardown, teardown(1, Teardown::Stopped)),
        Some(C::Release { lease: terms.lease })
    );
    assert_eq!(
        effect(Phase::Assigned, release(1, Outcome::Failed)),
        Some(C::Release { lease: terms.lease })
    );
    assert_eq!(effect(Phase::Capacity, release(1, Outcome::Done)), None, "never charged");
    let busy = at_phase(Phase::Busy);
    let reaped = busy
        .decide(&leasehold_domain::runner::RunnerCommand::Reap, &fixtures::ctx_at(200))
        .expect("reaped");
    assert_eq!(capacity_effect(&busy, &reaped), None, "quarantine is still charged");
}
