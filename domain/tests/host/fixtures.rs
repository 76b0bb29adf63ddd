//! Givens for the host's tests: ids, specs, demands, and the histories that put a host in
//! each state. A history is commands with the minute each was decided at.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use leasehold_domain::host::{Gate, Host, HostCapacity, HostCommand, HostError, HostSpec};
use leasehold_domain::values::fleet::{
    AgentUrl, Arch, Demand, GpuKind, HostBackend, HostId, Labels, MigInstance, MigProfile, VmId,
};
use leasehold_domain::{Actor, Aggregate, Context, DomainEvent, TenantId};
use uuid::Uuid;

pub fn t(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, minute, 0).single().expect("a valid time")
}

pub fn ctx_at(minute: u32) -> Context<()> {
    Context {
        now: t(minute),
        tenant: TenantId::parse("fleet").expect("valid"),
        actor: Actor { subject: "ops".into(), role: "operator".into() },
        new_ids: Vec::new(),
        facts: (),
    }
}

pub fn host_id() -> HostId {
    HostId::parse("host", "agent-1").expect("valid")
}

pub fn vm(n: u128) -> VmId {
    VmId(Uuid::from_u128(n))
}

pub fn arch(name: &str) -> Arch {
    Arch::parse("arch", name).expect("valid")
}

pub fn gpu(name: &str) -> GpuKind {
    GpuKind::parse("gpuKind", name).expect("valid")
}

pub fn profile(name: &str) -> MigProfile {
    MigProfile::parse("gpuProfile", name).expect("valid")
}

pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::parse("labels", pairs.iter().copied()).expect("valid")
}

/// A firecracker host: 16 vCPUs, 64 GiB, 1000 GB, 4 VMs, amd64, labelled zone=a.
pub fn spec() -> HostSpec {
    HostSpec {
        url: AgentUrl::parse("url", "https://agent-1.local:8443").expect("valid"),
        region: None,
        backend: HostBackend::Firecracker,
        labels: labels(&[("zone", "a")]),
        capacity: HostCapacity {
            cpus: 16,
            ram_mb: 65_536,
            storage_gb: 1_000,
            vm_count: 4,
            arch: Arch::amd64(),
            gpus: 0,
            gpu_kind: None,
            mig_profiles: BTreeMap::new(),
            mig_instances: Vec::new(),
        },
    }
}

pub fn register(spec: HostSpec) -> HostCommand {
    HostCommand::Register { id: host_id(), spec }
}

pub fn demand_of(cpus: u32, ram_mb: u64, storage_gb: u64) -> Demand {
    Demand {
        cpus,
        ram_mb,
        storage_gb,
        arch: None,
        gpus: 0,
        gpu_kind: None,
        gpu_profile: None,
        labels: Labels::default(),
    }
}

/// 2 vCPUs, 2 GiB, 10 GB.
pub fn small() -> Demand {
    demand_of(2, 2_048, 10)
}

pub fn reserve(n: u128, demand: Demand) -> HostCommand {
    HostCommand::Reserve { vm: vm(n), demand }
}

pub type History = Vec<(HostCommand, u32)>;

pub fn active() -> History {
    vec![(register(spec()), 1)]
}

pub fn cordoned() -> History {
    [active(), vec![(HostCommand::Cordon, 2)]].concat()
}

pub fn draining() -> History {
    [active(), vec![(HostCommand::Drain, 2)]].concat()
}

pub fn removed() -> History {
    [active(), vec![(HostCommand::Remove, 2)]].concat()
}

/// Active, with VM 1 holding `small()`.
pub fn with_vm() -> History {
    [active(), vec![(reserve(1, small()), 2)]].concat()
}

/// A qemu host with `gpus` a100s, two 1g.10gb MIG instances by count, or `instances`.
pub fn gpu_host(gpus: u32, instances: &[MigInstance]) -> History {
    let mut qemu = spec();
    qemu.backend = HostBackend::Qemu;
    qemu.capacity.gpus = gpus;
    qemu.capacity.gpu_kind = Some(gpu("a100"));
    if instances.is_empty() {
        qemu.capacity.mig_profiles.insert(profile("1g.10gb"), 2);
    }
    qemu.capacity.mig_instances = instances.to_vec();
    vec![(register(qemu), 1)]
}

/// The state after deciding each command of `history` at its minute; every one must be
/// accepted.
pub fn replay(history: &[(HostCommand, u32)]) -> Host {
    history.iter().fold(Host::initial(), |host, (command, minute)| {
        let events = host.decide(command, &ctx_at(*minute)).expect("a history that is accepted");
        events.iter().fold(host, |host, event| host.evolve(event))
    })
}

#[derive(Debug)]
pub enum Expect {
    /// These event types, in order.
    Events(&'static [&'static str]),
    /// Accepted with nothing to append.
    NoChange,
    /// Refused with this error.
    Refused(HostError),
}

pub fn does_not_fit(gate: Gate) -> Expect {
    Expect::Refused(HostError::DoesNotFit { gate })
}

/// One row, decided at minute 30.
pub fn check(given: &[(HostCommand, u32)], when: HostCommand, expect: Expect) -> Host {
    check_at(given, when, 30, expect)
}

/// One row: given a history, when a command is decided at `minute`, the expectation holds.
/// Returns the state after the new events.
pub fn check_at(
    given: &[(HostCommand, u32)],
    when: HostCommand,
    minute: u32,
    expect: Expect,
) -> Host {
    let before = replay(given);
    let decided = before.decide(&when, &ctx_at(minute));
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
    decided.unwrap_or_default().iter().fold(before, |host, event| host.evolve(event))
}
