//! The host's transition table, row by row (the doc comment of `domain/src/host.rs`), with
//! every guard's refusal and every placement gate; then properties over random command
//! sequences: per host, the sum of reservations equals what is allocated and never exceeds
//! capacity.

mod fixtures;
mod placement;
mod properties;

use fixtures::*;
use leasehold_domain::host::{Gate, HostCommand as C, HostError, HostStatus};
use leasehold_domain::values::fleet::{HostBackend, MigInstance};
use leasehold_domain::{Refusal, RefusalKind};

use Expect::{Events, NoChange, Refused};

fn invalid(status: &'static str, command: &'static str) -> Expect {
    Refused(HostError::InvalidState { status, command })
}

#[test]
fn registering() {
    let host = check(&[], register(spec()), Events(&["HostRegistered"]));
    assert_eq!(host.status, HostStatus::Active);
    assert_eq!(host.last_seen, Some(t(30)), "registering is being seen");
    assert_eq!(host.id, Some(host_id()));
    // A removed host may come back, with nothing bound.
    let host = check(&removed(), register(spec()), Events(&["HostRegistered"]));
    assert_eq!((host.status, host.reservations.len()), (HostStatus::Active, 0));
}

#[test]
fn register_again_is_an_upsert() {
    for given in [active(), cordoned(), draining()] {
        let status = replay(&given).status;
        // Unchanged, it is a heartbeat: seen, at most once a minute.
        let seen = check(&given, register(spec()), Events(&["HostHeartbeat"]));
        assert_eq!(seen.last_seen, Some(t(30)));
        let again = [given.clone(), vec![(register(spec()), 30)]].concat();
        check_at(&again, register(spec()), 30, NoChange);
        let mut more = spec();
        more.capacity.cpus = 64;
        let host = check(&given, register(more), Events(&["HostRefreshed"]));
        assert_eq!(host.status, status, "an upsert keeps the state");
        assert_eq!(host.spec.expect("registered").capacity.cpus, 64);
    }
}

#[test]
fn gpus_and_mig_only_on_qemu() {
    let mut gpus = spec();
    gpus.capacity.gpus = 2;
    check(&[], register(gpus.clone()), Refused(HostError::GpuNeedsQemu));
    let mut mig = spec();
    mig.capacity.mig_profiles.insert(profile("1g.10gb"), 4);
    check(&[], register(mig), Refused(HostError::GpuNeedsQemu));
    let mut kind = spec();
    kind.capacity.gpu_kind = Some(gpu("a100"));
    check(&[], register(kind), Refused(HostError::GpuNeedsQemu));
    gpus.backend = HostBackend::Qemu;
    check(&[], register(gpus), Events(&["HostRegistered"]));
    assert_eq!(HostError::GpuNeedsQemu.kind(), RefusalKind::BadInput);
}

#[test]
fn the_backend_changes_only_while_no_vm_is_bound() {
    let mut qemu = spec();
    qemu.backend = HostBackend::Qemu;
    check(&active(), register(qemu.clone()), Events(&["HostRefreshed"]));
    check(&with_vm(), register(qemu), Refused(HostError::BackendChangeWithVms));
}

#[test]
fn heartbeat() {
    let host = check_at(&active(), C::Heartbeat, 30, Events(&["HostHeartbeat"]));
    assert_eq!(host.last_seen, Some(t(30)));
    let beat = [active(), vec![(C::Heartbeat, 30)]].concat();
    // Within a minute of the recorded one, nothing; after it, recorded again.
    check_at(&beat, C::Heartbeat, 30, NoChange);
    check_at(&beat, C::Heartbeat, 31, Events(&["HostHeartbeat"]));
    check(&cordoned(), C::Heartbeat, Events(&["HostHeartbeat"]));
    check(&draining(), C::Heartbeat, Events(&["HostHeartbeat"]));
    check(&removed(), C::Heartbeat, invalid("removed", "heartbeat"));
    check(&[], C::Heartbeat, Refused(HostError::NotFound));
}

#[test]
fn cordon() {
    let host = check(&active(), C::Cordon, Events(&["HostCordoned"]));
    assert_eq!(host.status, HostStatus::Cordoned);
    check(&cordoned(), C::Cordon, NoChange);
    check(&draining(), C::Cordon, invalid("draining", "cordon"));
    check(&removed(), C::Cordon, invalid("removed", "cordon"));
    // VMs bound keep their room.
    let host = check(&with_vm(), C::Cordon, Events(&["HostCordoned"]));
    assert_eq!(host.reservations.len(), 1);
}

#[test]
fn drain() {
    for given in [active(), cordoned()] {
        let host = check(&given, C::Drain, Events(&["HostDraining"]));
        assert_eq!(host.status, HostStatus::Draining);
    }
    check(&draining(), C::Drain, NoChange);
    check(&removed(), C::Drain, invalid("removed", "drain"));
}

#[test]
fn uncordon() {
    for given in [cordoned(), draining()] {
        let host = check(&given, C::Uncordon, Events(&["HostUncordoned"]));
        assert_eq!(host.status, HostStatus::Active);
    }
    check(&active(), C::Uncordon, NoChange);
    check(&removed(), C::Uncordon, invalid("removed", "uncordon"));
}

#[test]
fn removing() {
    for given in [active(), cordoned(), draining()] {
        let host = check(&given, C::Remove, Events(&["HostRemoved"]));
        assert_eq!(host.status, HostStatus::Removed);
    }
    check(&removed(), C::Remove, NoChange);
    check(&with_vm(), C::Remove, Refused(HostError::HostHasVms { count: 1 }));
    let released = [with_vm(), vec![(C::Release { vm: vm(1) }, 30)]].concat();
    check(&released, C::Remove, Events(&["HostRemoved"]));
    check(&[], C::Remove, Refused(HostError::NotFound));
}

#[test]
fn reserving() {
    let host = check(&active(), reserve(1, small()), Events(&["HostCapacityReserved"]));
    assert_eq!(host.allocated.cpus, 2);
    assert_eq!(host.allocated.vm_count, 1);
    // The same VM asking the same again: nothing; asking for something else: a conflict.
    check(&with_vm(), reserve(1, small()), NoChange);
    let mut bigger = small();
    bigger.cpus = 4;
    check(&with_vm(), reserve(1, bigger), Refused(HostError::ReservationMismatch));
    for given in [cordoned(), draining(), removed()] {
        check(&given, reserve(2, small()), does_not_fit(Gate::HostActive));
    }
    check(&[], reserve(2, small()), Refused(HostError::NotFound));
}

#[test]
fn each_gate_names_itself() {
    let mut demand = small();
    demand.gpus = 1;
    check(&active(), reserve(2, demand), does_not_fit(Gate::Backend));
    let mut demand = small();
    demand.arch = Some(arch("arm64"));
    check(&active(), reserve(2, demand), does_not_fit(Gate::Arch));
    let mut demand = small();
    demand.labels = labels(&[("zone", "b")]);
    check(&active(), reserve(2, demand), does_not_fit(Gate::Labels));
    let mut demand = small();
    demand.labels = labels(&[("zone", "a")]);
    check(&active(), reserve(2, demand), Events(&["HostCapacityReserved"]));
    for (gate, demand) in [
        (Gate::Cpus, demand_of(17, 1, 1)),
        (Gate::Ram, demand_of(1, 65_537, 1)),
        (Gate::Storage, demand_of(1, 1, 1_001)),
    ] {
        check(&active(), reserve(2, demand), does_not_fit(gate));
    }
    // Exactly the room left fits; one more VM than the count does not.
    check(&active(), reserve(2, demand_of(16, 65_536, 1_000)), Events(&["HostCapacityReserved"]));
    let full: Vec<_> = (1..=4).map(|n| (reserve(n, demand_of(1, 1, 1)), 20)).collect();
    let full = [active(), full].concat();
    check(&full, reserve(9, demand_of(1, 1, 1)), does_not_fit(Gate::VmCount));
    assert_eq!(
        HostError::DoesNotFit { gate: Gate::Ram }.to_string(),
        "the VM does not fit the host: ram"
    );
}

#[test]
fn gpu_gates() {
    let given = gpu_host(2, &[]);
    let mut demand = small();
    demand.gpus = 2;
    demand.gpu_kind = Some(gpu("h100"));
    check(&given, reserve(2, demand.clone()), does_not_fit(Gate::GpuKind));
    demand.gpu_kind = Some(gpu("a100"));
    let host = check(&given, reserve(2, demand.clone()), Events(&["HostCapacityReserved"]));
    assert_eq!(host.allocated.gpus, 2);
    demand.gpus = 3;
    check(&given, reserve(2, demand), does_not_fit(Gate::Gpus));
}

#[test]
fn mig_by_count_and_by_instance() {
    let counted = gpu_host(0, &[]);
    let mut demand = small();
    demand.gpu_profile = Some(profile("1g.10gb"));
    demand.gpus = 2;
    let host = check(&counted, reserve(2, demand.clone()), Events(&["HostCapacityReserved"]));
    assert_eq!(host.allocated.mig.get(&profile("1g.10gb")), Some(&2));
    demand.gpus = 3;
    check(&counted, reserve(2, demand.clone()), does_not_fit(Gate::MigProfile));
    demand.gpu_profile = Some(profile("3g.40gb"));
    demand.gpus = 1;
    check(&counted, reserve(2, demand), does_not_fit(Gate::MigProfile));

    let instances = [instance("MIG-b", "1g.10gb"), instance("MIG-a", "1g.10gb")];
    let given = gpu_host(0, &instances);
    let mut demand = small();
    demand.gpu_profile = Some(profile("1g.10gb"));
    demand.gpus = 1;
    let host = check(&given, reserve(2, demand.clone()), Events(&["HostCapacityReserved"]));
    assert_eq!(host.reservations[&vm(2)].mig_instances, ["MIG-a"], "the lowest free first");
    let taken = [given, vec![(reserve(2, demand.clone()), 20)]].concat();
    let host = check(&taken, reserve(3, demand.clone()), Events(&["HostCapacityReserved"]));
    assert_eq!(host.reservations[&vm(3)].mig_instances, ["MIG-b"]);
    let both = [taken, vec![(reserve(3, demand.clone()), 21)]].concat();
    check(&both, reserve(4, demand), does_not_fit(Gate::MigProfile));
}

#[test]
fn releasing() {
    let host = check(&with_vm(), C::Release { vm: vm(1) }, Events(&["HostCapacityReleased"]));
    assert_eq!((host.allocated.cpus, host.allocated.vm_count), (0, 0));
    check(&active(), C::Release { vm: vm(1) }, NoChange);
    check(&removed(), C::Release { vm: vm(1) }, NoChange);
    let cordoned_with_vm = [with_vm(), vec![(C::Cordon, 21)]].concat();
    check(&cordoned_with_vm, C::Release { vm: vm(1) }, Events(&["HostCapacityReleased"]));
}

#[test]
fn refreshed_below_allocation_leaves_negative_headroom() {
    let mut smaller = spec();
    smaller.capacity.cpus = 1;
    let given = [with_vm(), vec![(register(smaller), 21)]].concat();
    let host = replay(&given);
    assert_eq!(host.headroom().expect("registered").cpus, -1);
    check(&given, reserve(2, demand_of(1, 1, 1)), does_not_fit(Gate::Cpus));
}

fn instance(uuid: &str, name: &str) -> MigInstance {
    MigInstance { uuid: uuid.into(), profile: profile(name), kind: gpu("a100") }
}
