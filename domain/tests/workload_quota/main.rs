//! The workload quota's transition table (the doc comment of
//! `domain/src/workload_quota.rs`), row by row with every guard's refusal, then a property
//! over random sequences of charges: usage is the sum of what the workloads hold, and an
//! accepted admission never grows a resource past its limit (facts are recorded whatever they
//! come to).

use chrono::{DateTime, TimeZone, Utc};
use leasehold_domain::workload_quota::{
    Charge, ChargeChange, Limit, WorkloadKind, WorkloadQuota, WorkloadQuotaCommand as Q,
    WorkloadQuotaError,
};
use leasehold_domain::{Actor, Aggregate, Context, DomainEvent, Refusal, RefusalKind, TenantId};
use proptest::prelude::*;

fn t(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 5, 12, 0, second).single().expect("a valid time")
}

fn ctx() -> Context<()> {
    Context {
        now: t(30),
        tenant: TenantId::parse("acme").expect("valid"),
        actor: Actor { subject: "ops".into(), role: "operator".into() },
        new_ids: Vec::new(),
        facts: (),
    }
}

fn apply(quota: WorkloadQuota, command: &Q) -> Result<WorkloadQuota, WorkloadQuotaError> {
    let events = quota.decide(command, &ctx())?;
    Ok(events.iter().fold(quota, |quota, event| quota.evolve(event)))
}

fn types(quota: &WorkloadQuota, command: &Q) -> Result<Vec<&'static str>, WorkloadQuotaError> {
    Ok(quota.decide(command, &ctx())?.iter().map(DomainEvent::event_type).collect())
}

fn limits(kind: WorkloadKind, limits: &[(&str, u64)]) -> Q {
    let limits =
        limits.iter().map(|(resource, max)| Limit { resource: (*resource).into(), max: *max });
    Q::SetLimits { kind, limits: limits.collect() }
}

fn vm(cpus: u64) -> Charge {
    Charge::of([("cpus".to_owned(), cpus), ("gpus".to_owned(), 0), ("ram_mb".to_owned(), 512)])
}

/// `workload` going from holding `before` to holding `after`, as its own stream says.
fn moves(workload: &str, before: Option<Charge>, after: Option<Charge>) -> ChargeChange {
    ChargeChange { workload: workload.into(), before, charge: after }
}

/// `workload` starting to hold `charge`.
fn holds(workload: &str, charge: Charge) -> ChargeChange {
    moves(workload, None, Some(charge))
}

/// `workload` ending, having held `charge`.
fn ends(workload: &str, charge: Charge) -> ChargeChange {
    moves(workload, Some(charge), None)
}

/// An admission of `changes` (a creation among its commands).
fn charge(changes: Vec<ChargeChange>) -> Q {
    Q::Apply { kind: WorkloadKind::Vm, changes, admission: true }
}

/// `changes` recorded as facts (a boot reported, a VM found missing).
fn fact(changes: Vec<ChargeChange>) -> Q {
    Q::Apply { kind: WorkloadKind::Vm, changes, admission: false }
}

fn limited(max: &[(&str, u64)]) -> WorkloadQuota {
    apply(WorkloadQuota::initial(), &limits(WorkloadKind::Vm, max)).expect("limits set")
}

#[test]
fn set_limits_records_them_once_and_refuses_a_resource_the_kind_never_holds() {
    let quota = WorkloadQuota::initial();
    let set = limits(WorkloadKind::Vm, &[("count", 2), ("cpus", 8)]);
    assert_eq!(types(&quota, &set), Ok(vec!["WorkloadLimitsSet"]));
    let quota = apply(quota, &set).expect("set");
    assert_eq!(types(&quota, &set), Ok(vec![]), "unchanged: nothing to record");
    // A 0 is no limit, the same as leaving the resource out.
    let zero = limits(WorkloadKind::Vm, &[("count", 2), ("cpus", 8), ("gpus", 0)]);
    assert_eq!(types(&quota, &zero), Ok(vec![]));
    for (kind, resource) in [
        (WorkloadKind::Vm, "sku.gpu-a100"),
        (WorkloadKind::Lease, "cpus"),
        (WorkloadKind::Lease, "sku.Bad SKU"),
        (WorkloadKind::Run, "bytes"),
    ] {
        let refused = quota.decide(&limits(kind, &[(resource, 1)]), &ctx());
        let expected = WorkloadQuotaError::UnknownResource { kind, resource: resource.into() };
        assert_eq!(refused, Err(expected.clone()));
        assert_eq!(expected.kind(), RefusalKind::BadInput);
    }
    assert!(WorkloadKind::Lease.holds("sku.gpu.h100.1x") && WorkloadKind::Lease.holds("count"));
    assert!(WorkloadKind::Rental.holds("cpu_millis") && !WorkloadKind::Rental.holds("cpus"));
}

#[test]
fn a_charge_is_refused_when_it_grows_a_resource_past_its_limit() {
    let quota = limited(&[("count", 2), ("cpus", 8)]);
    let quota = apply(quota, &charge(vec![holds("vm-1", vm(4))])).expect("room");
    // Exactly at the limit is accepted.
    let quota = apply(quota, &charge(vec![holds("vm-2", vm(4))])).expect("at the limit");
    assert_eq!(quota.usage.get("cpus"), Some(&8));
    assert_eq!(quota.usage.get("count"), Some(&2));
    let third = quota.decide(&charge(vec![holds("vm-3", vm(1))]), &ctx());
    let refused = WorkloadQuotaError::QuotaExceeded {
        kind: WorkloadKind::Vm,
        resource: "count".into(),
        max: 2,
    };
    assert_eq!(third, Err(refused.clone()));
    assert_eq!(refused.kind(), RefusalKind::QuotaExceeded);
    assert_eq!(refused.to_string(), "vm quota exceeded: at most 2 of vm.count");
    // The same charge again changes nothing; a release is never refused.
    let same = moves("vm-1", Some(vm(4)), Some(vm(4)));
    assert_eq!(types(&quota, &charge(vec![same])), Ok(vec![]));
    assert_eq!(types(&quota, &charge(vec![moves("vm-9", None, None)])), Ok(vec![]));
    let released = apply(quota, &charge(vec![ends("vm-1", vm(4))])).expect("released");
    assert_eq!(released.usage.get("cpus"), Some(&4));
    let cpus = released.decide(&charge(vec![holds("vm-3", vm(5))]), &ctx());
    let refused = WorkloadQuotaError::QuotaExceeded {
        kind: WorkloadKind::Vm,
        resource: "cpus".into(),
        max: 8,
    };
    assert_eq!(cpus, Err(refused));
}

#[test]
fn a_move_within_one_application_is_never_refused_and_a_lower_limit_keeps_what_is_held() {
    let quota = limited(&[("count", 1)]);
    let quota = apply(quota, &charge(vec![holds("vm-1", vm(4))])).expect("room");
    // A migration: the copy starts holding as its source stops, in one append.
    let moved = charge(vec![holds("vm-2", vm(4)), ends("vm-1", vm(4))]);
    assert_eq!(types(&quota, &moved), Ok(vec!["WorkloadReserved", "WorkloadReleased"]));
    let quota = apply(quota, &moved).expect("a move grows nothing");
    assert_eq!(quota.usage.get("count"), Some(&1));
    // Limits lowered under usage: what is held stays, what shrinks passes, what grows not.
    let quota =
        apply(quota, &limits(WorkloadKind::Vm, &[("count", 1), ("cpus", 2)])).expect("lowered");
    assert_eq!(quota.usage.get("cpus"), Some(&4));
    let shrunk = apply(quota.clone(), &charge(vec![moves("vm-2", Some(vm(4)), Some(vm(3)))]));
    assert_eq!(shrunk.expect("shrinking is accepted").usage.get("cpus"), Some(&3));
    let grown = quota.decide(&charge(vec![moves("vm-2", Some(vm(4)), Some(vm(5)))]), &ctx());
    assert!(matches!(grown, Err(WorkloadQuotaError::QuotaExceeded { .. })), "{grown:?}");
}

#[test]
fn a_fact_is_recorded_past_a_limit_and_only_admissions_are_refused() {
    let quota = limited(&[("count", 1)]);
    let quota = apply(quota, &charge(vec![holds("vm-1", vm(4))])).expect("room");
    let admitted = quota.decide(&charge(vec![holds("vm-2", vm(4))]), &ctx());
    assert!(matches!(admitted, Err(WorkloadQuotaError::QuotaExceeded { .. })), "{admitted:?}");
    // A copy reported booted while its source went missing: recorded whatever it comes to.
    assert_eq!(types(&quota, &fact(vec![holds("vm-2", vm(4))])), Ok(vec!["WorkloadReserved"]));
    let over = apply(quota, &fact(vec![holds("vm-2", vm(4))])).expect("a fact");
    assert_eq!(over.usage.get("count"), Some(&2));
    // Over the limit, nothing more is admitted until usage falls below it.
    let more = over.decide(&charge(vec![holds("vm-3", vm(1))]), &ctx());
    assert!(matches!(more, Err(WorkloadQuotaError::QuotaExceeded { .. })), "{more:?}");
    let released = apply(over, &fact(vec![ends("vm-1", vm(4))])).expect("released");
    assert_eq!(released.usage.get("count"), Some(&1));
}

#[test]
fn a_charge_counts_one_workload_and_sums_a_resource_named_twice() {
    let charge = Charge::of([("sku.cpu".to_owned(), 2), ("sku.cpu".to_owned(), 3)]);
    let held: Vec<(&str, u64)> = charge.resources().collect();
    assert_eq!(held, [("sku.cpu", 5)]);
    assert_eq!(charge.held[0].resource, "count");
    assert_eq!(charge.held[0].quantity, 1);
}

proptest! {
    /// Whatever the order of charges, releases and limit changes: usage is the sum of what
    /// the workloads hold, and no accepted application grows a resource past its limit.
    #[test]
    fn usage_is_the_sum_of_the_holdings_and_growth_never_passes_a_limit(
        steps in proptest::collection::vec((0u8..4, 0u8..6, 0u64..6), 1..60)
    ) {
        let mut quota = WorkloadQuota::initial();
        // What each workload holds, as its own stream would say.
        let mut holding = std::collections::BTreeMap::<String, Charge>::new();
        for (what, workload, amount) in steps {
            let workload = format!("vm-{workload}");
            let before = holding.get(&workload).cloned();
            let command = match what {
                0 => limits(WorkloadKind::Vm, &[("count", amount), ("cpus", amount * 2)]),
                1 => charge(vec![moves(&workload, before, Some(vm(amount)))]),
                2 => fact(vec![moves(&workload, before, Some(vm(amount)))]),
                _ => charge(vec![moves(&workload, before, None)]),
            };
            let admission = matches!(command, Q::Apply { admission: true, .. });
            let previous = quota.clone();
            let Ok(after) = apply(quota.clone(), &command) else { continue };
            match what {
                1 | 2 => { holding.insert(workload, vm(amount)); }
                3.. => { holding.remove(&workload); }
                _ => {}
            }
            for (resource, max) in after.limits.iter().filter(|_| admission) {
                let (was, is) = (previous.usage.get(resource), after.usage.get(resource));
                let (was, is) = (was.copied().unwrap_or(0), is.copied().unwrap_or(0));
                prop_assert!(is <= was || is <= *max, "{resource}: {was} -> {is} past {max}");
            }
            let mut summed = std::collections::BTreeMap::<String, u64>::new();
            for held in holding.values().flat_map(|charge| &charge.held) {
                *summed.entry(held.resource.clone()).or_default() += held.quantity;
            }
            summed.retain(|_, quantity| *quantity > 0);
            prop_assert_eq!(&summed, &after.usage);
            quota = after;
        }
    }
}
