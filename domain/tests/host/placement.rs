//! Placement over a few hosts: the policy among hosts that pass every gate, locality only as
//! a tie-break, a pin as a hard gate, and the refusal naming the gate that kept the VM off.

use std::collections::BTreeSet;

use leasehold_domain::host::placement::{PlacementRequest, place};
use leasehold_domain::host::{Gate, Host, HostCommand};
use leasehold_domain::values::fleet::{Demand, HostId};
use leasehold_domain::vm::PlacementPolicy;

use super::fixtures::*;

fn named(name: &str) -> HostId {
    HostId::parse("host", name).expect("valid")
}

/// A registered host `name` with `cpus` vCPUs, after `more` commands.
fn host(name: &str, cpus: u32, more: &[HostCommand]) -> Host {
    let mut declared = spec();
    declared.capacity.cpus = cpus;
    let mut history = vec![(HostCommand::Register { id: named(name), spec: declared }, 1)];
    history.extend(more.iter().cloned().map(|command| (command, 2)));
    replay(&history)
}

fn request<'a>(
    demand: &'a Demand,
    pin: Option<&'a HostId>,
    policy: PlacementPolicy,
    local: &'a BTreeSet<HostId>,
    excluded: &'a BTreeSet<HostId>,
) -> PlacementRequest<'a> {
    PlacementRequest {
        demand,
        pin,
        policy,
        artifact_hosts: local,
        excluded,
        retries: 0,
        tie_break: 0,
    }
}

#[test]
fn spread_takes_the_most_room_and_pack_the_least() {
    let hosts = [host("a", 8, &[]), host("b", 16, &[]), host("c", 4, &[])];
    let (none, demand) = (BTreeSet::new(), small());
    let spread = place(&hosts, &request(&demand, None, PlacementPolicy::Spread, &none, &none))
        .expect("placed");
    assert_eq!((spread.host.as_str(), spread.candidates, spread.headroom_cpus), ("b", 3, 14));
    let pack = place(&hosts, &request(&demand, None, PlacementPolicy::Pack, &none, &none))
        .expect("placed");
    assert_eq!(pack.host.as_str(), "c");
}

#[test]
fn locality_only_breaks_ties_and_never_passes_a_gate() {
    let hosts = [host("a", 8, &[]), host("b", 8, &[]), host("c", 8, &[HostCommand::Cordon])];
    let none = BTreeSet::new();
    let demand = small();
    let plain = place(&hosts, &request(&demand, None, PlacementPolicy::Spread, &none, &none))
        .expect("placed");
    let tied = plain.host.clone();
    let again = place(&hosts, &request(&demand, None, PlacementPolicy::Spread, &none, &none))
        .expect("placed");
    assert_eq!(again.host, tied, "the same VM gets the same answer");
    let on_b: BTreeSet<HostId> = [named("b")].into();
    let local = place(&hosts, &request(&demand, None, PlacementPolicy::Spread, &on_b, &none))
        .expect("placed");
    assert_eq!((local.host.as_str(), local.artifact_local), ("b", true));
    let on_c: BTreeSet<HostId> = [named("c")].into();
    let gated = place(&hosts, &request(&demand, None, PlacementPolicy::Spread, &on_c, &none))
        .expect("placed");
    assert_eq!(
        (gated.host.as_str(), gated.artifact_local),
        ("a", false),
        "a cordoned host stays out"
    );
    let bigger = [host("a", 8, &[]), host("b", 4, &[])];
    let roomier = place(&bigger, &request(&demand, None, PlacementPolicy::Spread, &on_b, &none))
        .expect("placed");
    assert_eq!(roomier.host.as_str(), "a", "locality never beats the policy");
}

#[test]
fn a_pin_is_a_hard_gate() {
    let hosts = [host("a", 8, &[]), host("b", 8, &[HostCommand::Cordon])];
    let none = BTreeSet::new();
    let demand = small();
    let (a, b, z) = (named("a"), named("b"), named("z"));
    let pinned = place(&hosts, &request(&demand, Some(&a), PlacementPolicy::Pack, &none, &none))
        .expect("placed");
    assert_eq!((pinned.host.as_str(), pinned.candidates), ("a", 1));
    let cordoned =
        place(&hosts, &request(&demand, Some(&b), PlacementPolicy::Spread, &none, &none));
    assert_eq!(cordoned, Err(Gate::HostActive));
    let unknown = place(&hosts, &request(&demand, Some(&z), PlacementPolicy::Spread, &none, &none));
    assert_eq!(unknown, Err(Gate::Pin));
}

#[test]
fn the_refusal_names_the_furthest_gate() {
    let hosts = [host("a", 2, &[]), host("b", 8, &[HostCommand::Cordon])];
    let none = BTreeSet::new();
    let mut labelled = small();
    labelled.labels = labels(&[("zone", "nowhere")]);
    assert_eq!(
        place(&hosts, &request(&labelled, None, PlacementPolicy::Spread, &none, &none)),
        Err(Gate::Labels)
    );
    let mut gpu = small();
    gpu.gpus = 1;
    assert_eq!(
        place(&hosts, &request(&gpu, None, PlacementPolicy::Spread, &none, &none)),
        Err(Gate::Backend)
    );
    let big = demand_of(4, 1, 1);
    assert_eq!(
        place(&hosts, &request(&big, None, PlacementPolicy::Spread, &none, &none)),
        Err(Gate::Cpus)
    );
    assert_eq!(
        place::<Host>(&[], &request(&big, None, PlacementPolicy::Spread, &none, &none)),
        Err(Gate::HostActive)
    );
}

#[test]
fn hosts_refused_by_their_own_reserve_are_skipped() {
    let hosts = [host("a", 8, &[]), host("b", 16, &[])];
    let none = BTreeSet::new();
    let tried: BTreeSet<HostId> = [named("b")].into();
    let demand = small();
    let again = place(&hosts, &request(&demand, None, PlacementPolicy::Spread, &none, &tried))
        .expect("placed");
    assert_eq!(again.host.as_str(), "a");
}

#[test]
fn equal_hosts_are_spread_over_by_the_vms_own_order() {
    let hosts: Vec<Host> = (0..10).map(|n| host(&format!("h{n}"), 8, &[])).collect();
    let none = BTreeSet::new();
    let demand = small();
    let chosen: BTreeSet<String> = (0..32u64)
        .map(|vm| {
            let ask = PlacementRequest {
                tie_break: vm.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ..request(&demand, None, PlacementPolicy::Spread, &none, &none)
            };
            place(&hosts, &ask).expect("placed").host.to_string()
        })
        .collect();
    assert!(chosen.len() >= 5, "32 VMs over 10 equal hosts use many of them: {chosen:?}");
}
