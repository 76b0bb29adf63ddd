//! Givens for the VM's tests: a spec, its placement, contexts, and the histories that put a VM
//! in each state. A history is commands with the minute each was decided at.

use chrono::{DateTime, TimeZone, Utc};
use leasehold_domain::values::fleet::{HostId, Labels, TaskId, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail, Reason, TenantMessage};
use leasehold_domain::vm::{
    BootFailure, CredentialRef, Found, Placement, PlacementPolicy, Vm, VmCommand, VmError, VmFacts,
    VmSpec, VmUrl,
};
use leasehold_domain::{Actor, Aggregate, Context, DomainEvent, TenantId};
use uuid::Uuid;

pub const VM: VmId = VmId(Uuid::from_u128(0x1));
pub const CREDENTIALS: CredentialRef = CredentialRef(Uuid::from_u128(0x2));
/// The boot's operation.
pub const BOOT: OperationId = OperationId(Uuid::from_u128(0x10));
/// A tenant's destroy.
pub const DESTROY: OperationId = OperationId(Uuid::from_u128(0x11));
/// The fresh id every command is decided with (a destroy the VM starts itself takes it).
pub const FRESH: Uuid = Uuid::from_u128(0x99);

pub fn t(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, minute, 0).single().expect("a valid time")
}

pub fn ctx_at(minute: u32, facts: VmFacts) -> Context<VmFacts> {
    Context {
        now: t(minute),
        tenant: TenantId::parse("tenant-a").expect("valid"),
        actor: Actor { subject: "alice".into(), role: "tenant".into() },
        new_ids: vec![FRESH],
        facts,
    }
}

pub fn host(name: &str) -> HostId {
    HostId::parse("host", name).expect("valid")
}

pub fn spec() -> VmSpec {
    VmSpec {
        cpus: 2,
        ram_mb: 2_048,
        storage_gb: 10,
        region: None,
        arch: None,
        gpus: 0,
        gpu_kind: None,
        gpu_profile: None,
        pin: None,
        labels: Labels::default(),
        max_runtime_seconds: None,
        idle_timeout_seconds: None,
        image: None,
        seed: None,
        resume_seed: false,
        huge_pages: false,
        egress_proxy: None,
        startup_script_timeout_seconds: None,
        guest_files: Vec::new(),
        expose: Vec::new(),
    }
}

pub fn placed_on(name: &str) -> Placement {
    Placement {
        host: host(name),
        policy: PlacementPolicy::Spread,
        candidates: 3,
        headroom_cpus: 14,
        headroom_ram_mb: 63_488,
        artifact_local: false,
        retries: 0,
    }
}

pub fn create_with(spec: VmSpec, placement: Placement) -> VmCommand {
    VmCommand::Create {
        vm: VM,
        task: TaskId::parse("task", "build-1").expect("valid"),
        spec: Box::new(spec),
        credentials: CREDENTIALS,
        placement,
        operation: BOOT,
        origin: None,
    }
}

pub fn create() -> VmCommand {
    create_with(spec(), placed_on("agent-1"))
}

pub fn url() -> VmUrl {
    VmUrl::parse("url", "10.0.0.5:19551").expect("valid")
}

pub fn booted() -> VmCommand {
    VmCommand::ReportBooted { operation: BOOT, url: url() }
}

pub fn boot_failed(operation: OperationId) -> VmCommand {
    VmCommand::ReportBootFailed {
        operation,
        failure: BootFailure {
            reason: Reason::parse("reason", "BootFailed").expect("valid"),
            message: TenantMessage::parse("message", "the VM could not boot").expect("valid"),
            detail: OperatorDetail::new("500 firecracker exited"),
        },
    }
}

pub fn missing(operation: OperationId) -> VmCommand {
    VmCommand::Recover { operation, found: Found::Missing }
}

pub type History = Vec<(VmCommand, u32)>;

pub fn provisioning() -> History {
    vec![(create(), 1)]
}

pub fn running() -> History {
    [provisioning(), vec![(booted(), 2)]].concat()
}

pub fn draining() -> History {
    [running(), vec![(VmCommand::Drain, 3)]].concat()
}

pub fn destroying() -> History {
    [running(), vec![(VmCommand::Destroy { operation: DESTROY }, 3)]].concat()
}

pub fn removed() -> History {
    [destroying(), vec![(VmCommand::ConfirmRemoved { operation: DESTROY }, 4)]].concat()
}

pub fn failed() -> History {
    [provisioning(), vec![(boot_failed(BOOT), 2)]].concat()
}

/// The state after deciding each command of `history` at its minute; every one must be
/// accepted.
pub fn replay(history: &[(VmCommand, u32)]) -> Vm {
    history.iter().fold(Vm::initial(), |vm, (command, minute)| {
        let events = vm
            .decide(command, &ctx_at(*minute, VmFacts::default()))
            .expect("a history that is accepted");
        events.iter().fold(vm, |vm, event| vm.evolve(event))
    })
}

#[derive(Debug)]
pub enum Expect {
    /// These event types, in order.
    Events(&'static [&'static str]),
    /// Accepted with nothing to append.
    NoChange,
    /// Refused with this error.
    Refused(VmError),
}

/// One row, decided at minute 30 with the default facts.
pub fn check(given: &[(VmCommand, u32)], when: VmCommand, expect: Expect) -> Vm {
    check_with(given, when, VmFacts::default(), 30, expect)
}

/// One row: given a history, when a command is decided at `minute` with `facts`, the
/// expectation holds. Returns the state after the new events.
pub fn check_with(
    given: &[(VmCommand, u32)],
    when: VmCommand,
    facts: VmFacts,
    minute: u32,
    expect: Expect,
) -> Vm {
    let before = replay(given);
    let decided = before.decide(&when, &ctx_at(minute, facts));
    match (&expect, &decided) {
        (Expect::Events(types), Ok(events)) => {
            let got: Vec<&str> = events.iter().map(DomainEvent::event_type).collect();
            assert_eq!(&got, types, "{} on {:?}", when.name(), before.status);
        }
        (Expect::NoChange, Ok(events)) => {
            assert!(events.is_empty(), "{} should change nothing, got {events:?}", when.name());
        }
        (Expect::Refused(error), Err(got)) => assert_eq!(got, error, "{}", when.name()),
        _ => panic!("{} on {:?}: expected {expect:?}, got {decided:?}", when.name(), before.status),
    }
    decided.unwrap_or_default().iter().fold(before, |vm, event| vm.evolve(event))
}
