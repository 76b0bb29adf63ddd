//! Givens for the lease's tests: ids, contexts, and the event histories that put a lease in
//! each status.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_domain::lease::{
    CloseCause, Lease, LeaseCommand, LeaseError, LeaseEvent, LeaseFacts, LeaseId, LeaseItem,
    LeaseItems, MaintenanceId, MaintenanceOutcome, OperationId, OperatorDetail, PayloadHash,
    ProviderId, Reason, RetainedSource, ServiceName, Sku, TenantMessage,
};
use leasehold_domain::{Actor, Aggregate, Context, DomainEvent, TenantId};
use uuid::Uuid;

pub const LEASE: LeaseId = LeaseId(Uuid::from_u128(0x1));
pub const SOURCE: LeaseId = LeaseId(Uuid::from_u128(0x2));
pub const PROVIDER: ProviderId = ProviderId(Uuid::from_u128(0x10));
pub const OTHER_PROVIDER: ProviderId = ProviderId(Uuid::from_u128(0x11));
pub const MAINTENANCE: MaintenanceId = MaintenanceId(Uuid::from_u128(0x20));
/// The operation of the first provision request.
pub const OPERATION: OperationId = OperationId(Uuid::from_u128(0x30));
/// The operation of a restore into LEASE.
pub const RESTORE_OPERATION: OperationId = OperationId(Uuid::from_u128(0x31));

pub fn t(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, minute, 0).single().expect("a valid time")
}

pub fn ctx_at(minute: u32, facts: LeaseFacts) -> Context<LeaseFacts> {
    Context {
        now: t(minute),
        tenant: TenantId::parse("tenant-a").expect("valid"),
        actor: Actor { subject: "alice".into(), role: "tenant".into() },
        new_ids: Vec::new(),
        facts,
    }
}

pub fn routed() -> LeaseFacts {
    LeaseFacts {
        backend: Some(ServiceName::parse("backend", "docker-1").expect("valid")),
        ..LeaseFacts::default()
    }
}

pub fn item(sku: &str, quantity: u32, service: &str) -> LeaseItem {
    LeaseItem {
        sku: Sku::parse("sku", sku).expect("valid"),
        quantity,
        service_name: Some(ServiceName::parse("service", service).expect("valid")),
        custom_domain: None,
    }
}

pub fn items() -> LeaseItems {
    LeaseItems::new(vec![item("gpu.h100.1x", 1, "trainer"), item("cpu.standard.4x", 2, "web")])
        .expect("valid")
}

pub fn hash(n: u8) -> PayloadHash {
    PayloadHash::parse("payloadHash", format!("{n:02x}").repeat(32)).expect("valid")
}

pub fn request() -> LeaseCommand {
    LeaseCommand::RequestProvision {
        lease: LEASE,
        provider: PROVIDER,
        items: items(),
        payload_hash: hash(1),
        operation: OPERATION,
    }
}

/// The backend's report that the first provision is done.
pub fn provisioned() -> LeaseCommand {
    provisioned_on(OPERATION)
}

/// The backend's report that `operation` is done.
pub fn provisioned_on(operation: OperationId) -> LeaseCommand {
    LeaseCommand::ReportProvisioned { operation }
}

pub fn failure() -> (Reason, TenantMessage, OperatorDetail) {
    (
        Reason::parse("reason", "ImagePullFailed").expect("valid"),
        TenantMessage::parse("message", "the image could not be pulled").expect("valid"),
        OperatorDetail::new("pull registry.internal/app: 401 at /var/lib/docker"),
    )
}

pub fn report_failed() -> LeaseCommand {
    report_failed_on(OPERATION)
}

pub fn report_failed_on(operation: OperationId) -> LeaseCommand {
    let (reason, message, detail) = failure();
    LeaseCommand::ReportFailed { operation, reason, message, detail }
}

pub fn complete(admitted_minute: u32, outcome: MaintenanceOutcome) -> LeaseCommand {
    LeaseCommand::CompleteMaintenance {
        maintenance_id: MAINTENANCE,
        admitted_at: Some(t(admitted_minute)),
        outcome,
    }
}

pub fn recovered() -> MaintenanceOutcome {
    let (reason, message, detail) = failure();
    MaintenanceOutcome::Recovered { reason, message, detail }
}

pub fn maintenance_failed() -> MaintenanceOutcome {
    let (reason, message, detail) = failure();
    MaintenanceOutcome::Failed { reason, message, detail }
}

/// Runs commands from the empty lease, each at the next minute, and returns every event.
/// Panics when one is refused: a given must be reachable.
pub fn history(commands: &[(LeaseCommand, LeaseFacts)]) -> Vec<LeaseEvent> {
    let mut lease = Lease::initial();
    let mut events = Vec::new();
    for (minute, (command, facts)) in commands.iter().enumerate() {
        let minute = u32::try_from(minute).expect("few commands");
        let new = lease
            .decide(command, &ctx_at(minute, facts.clone()))
            .unwrap_or_else(|e| panic!("given command {} refused: {e}", command.name()));
        lease = new.iter().fold(lease, |lease, event| lease.evolve(event));
        events.extend(new);
    }
    events
}

fn plain(command: LeaseCommand) -> (LeaseCommand, LeaseFacts) {
    (command, LeaseFacts::default())
}

pub fn provisioning() -> Vec<(LeaseCommand, LeaseFacts)> {
    vec![(request(), routed())]
}

pub fn ready() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = provisioning();
    given.push(plain(provisioned()));
    given
}

pub fn failing() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = ready();
    given.push(plain(LeaseCommand::ReportContainerDied {
        operation: OPERATION,
        detail: OperatorDetail::new("exit 137"),
    }));
    given
}

pub fn failed() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = failing();
    given.push(plain(report_failed()));
    given
}

/// Ready, then a restart admitted at minute 2.
pub fn restarting() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = ready();
    given.push(plain(LeaseCommand::Restart { maintenance_id: MAINTENANCE }));
    given
}

/// Ready, then an update admitted at minute 2.
pub fn updating() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = ready();
    given.push(plain(LeaseCommand::Update { maintenance_id: MAINTENANCE, payload_hash: hash(2) }));
    given
}

pub fn deprovisioning() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = ready();
    given.push(plain(LeaseCommand::Deprovision));
    given
}

pub fn deprovisioned() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = deprovisioning();
    given.push(plain(LeaseCommand::ConfirmDeprovisioned { retained: false }));
    given
}

pub fn retained() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = deprovisioning();
    let facts = LeaseFacts { retention_max_age: Some(TimeDelta::days(7)), ..LeaseFacts::default() };
    given.push((LeaseCommand::ConfirmDeprovisioned { retained: true }, facts));
    given
}

pub fn source_restoring() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = retained();
    given.push(plain(LeaseCommand::BeginRestore { into: LEASE }));
    given
}

pub fn reaping() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = retained();
    given.push(plain(LeaseCommand::Reap {
        cause: leasehold_domain::lease::ReapCause::GraceExpired,
    }));
    given
}

pub fn closed() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = ready();
    given.push(plain(LeaseCommand::Close { cause: CloseCause::Tenant }));
    given
}

pub fn rejected() -> Vec<(LeaseCommand, LeaseFacts)> {
    let mut given = provisioning();
    given.push(plain(report_failed()));
    given
}

/// A retained lease (id SOURCE) as looked up for a restore.
pub fn retained_source(same_tenant: bool, given: Vec<(LeaseCommand, LeaseFacts)>) -> LeaseFacts {
    let mut commands = given;
    if let (LeaseCommand::RequestProvision { lease, .. }, _) = &mut commands[0] {
        *lease = SOURCE;
    }
    let lease = Lease::replay(&history(&commands));
    LeaseFacts {
        retained_source: Some(RetainedSource { same_tenant, lease }),
        ..LeaseFacts::default()
    }
}

/// What a row of the table expects.
#[derive(Debug)]
pub enum Expect {
    /// These event types, in order.
    Events(&'static [&'static str]),
    /// Accepted with nothing to append.
    NoChange,
    /// Refused with this error.
    Refused(LeaseError),
}

/// One row: given a history, when a command is decided at minute 30 with these facts, then
/// the expectation holds. Returns the state after the new events.
pub fn check(
    given: &[(LeaseCommand, LeaseFacts)],
    when: LeaseCommand,
    facts: LeaseFacts,
    expect: Expect,
) -> Lease {
    let before = Lease::replay(&history(given));
    let decided = before.decide(&when, &ctx_at(30, facts));
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
    decided.unwrap_or_default().iter().fold(before, |lease, event| lease.evolve(event))
}
