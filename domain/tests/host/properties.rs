//! Properties over random command sequences: whatever is accepted, a host's allocation is
//! the sum of its reservations, never exceeds its capacity, and binds no MIG instance twice.

use std::collections::BTreeSet;

use leasehold_domain::host::{Allocation, Host, HostCommand, HostStatus};
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::{Aggregate, RefusalKind};
use proptest::prelude::*;

use super::fixtures::*;

fn qemu_spec() -> leasehold_domain::host::HostSpec {
    let mut qemu = spec();
    qemu.backend = HostBackend::Qemu;
    qemu.capacity.gpus = 4;
    qemu.capacity.gpu_kind = Some(gpu("a100"));
    qemu.capacity.mig_instances = ["MIG-1", "MIG-2", "MIG-3"]
        .map(|uuid| leasehold_domain::values::fleet::MigInstance {
            uuid: uuid.into(),
            profile: profile("1g.10gb"),
            kind: gpu("a100"),
        })
        .to_vec();
    qemu
}

fn command() -> impl Strategy<Value = HostCommand> {
    let vm_n = 1u128..8;
    prop_oneof![
        Just(register(qemu_spec())),
        Just(HostCommand::Cordon),
        Just(HostCommand::Drain),
        Just(HostCommand::Uncordon),
        Just(HostCommand::Remove),
        Just(HostCommand::Heartbeat),
        (vm_n.clone(), 1u32..8, 1u64..30_000, 1u64..400, 0u32..3, any::<bool>()).prop_map(
            |(n, cpus, ram, disk, gpus, mig)| {
                let mut demand = demand_of(cpus, ram, disk);
                demand.gpus = gpus;
                if mig {
                    demand.gpu_profile = Some(profile("1g.10gb"));
                }
                reserve(n, demand)
            }
        ),
        vm_n.prop_map(|n| HostCommand::Release { vm: vm(n) }),
    ]
}

fn assert_consistent(host: &Host) {
    assert_eq!(host.allocated, Allocation::of(host.reservations.values()), "allocation is the sum");
    let Some(spec) = &host.spec else { return };
    let capacity = &spec.capacity;
    assert!(host.allocated.cpus <= u64::from(capacity.cpus), "cpus: {host:?}");
    assert!(host.allocated.ram_mb <= capacity.ram_mb, "ram: {host:?}");
    assert!(host.allocated.storage_gb <= capacity.storage_gb, "storage: {host:?}");
    assert!(host.allocated.vm_count <= capacity.vm_count, "vm count: {host:?}");
    assert!(host.allocated.gpus <= u64::from(capacity.gpus), "gpus: {host:?}");
    let bound: Vec<&String> =
        host.reservations.values().flat_map(|held| held.mig_instances.iter()).collect();
    let unique: BTreeSet<&String> = bound.iter().copied().collect();
    assert_eq!(bound.len(), unique.len(), "no MIG instance bound twice");
    if host.status == HostStatus::Removed {
        assert!(host.reservations.is_empty(), "a removed host holds nothing");
    }
}

proptest! {
    #[test]
    fn allocation_is_the_sum_of_reservations_and_fits(
        commands in prop::collection::vec(command(), 1..60)
    ) {
        let mut host = Host::initial();
        for (minute, command) in commands.iter().enumerate() {
            match host.decide(command, &ctx_at(u32::try_from(minute % 60).unwrap_or(0))) {
                Ok(events) => {
                    host = events.iter().fold(host, |host, event| host.evolve(event));
                }
                Err(error) => {
                    let kind = leasehold_domain::Refusal::kind(&error);
                    prop_assert!(kind != RefusalKind::BadInput, "{error}");
                }
            }
            assert_consistent(&host);
        }
    }
}
