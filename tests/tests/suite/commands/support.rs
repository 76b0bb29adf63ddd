//! Commands on leases, as a gateway would send them.

use leasehold_adapters::PgEventStore;
use leasehold_commands::lease_input::{self, ItemInput, LeaseInputLimits, RequestLeaseInput};
use leasehold_commands::{CommandPipeline, CommandRequest, PipelineConfig};
use leasehold_domain::lease::{Lease, LeaseCommand, LeaseFacts, LeaseId, OperationId, ServiceName};
use leasehold_domain::{Actor, EventStore, OperationKey, RecordedEvent, TenantId};
use leasehold_tests::TestDb;
use uuid::Uuid;

pub type Pipeline = CommandPipeline<PgEventStore>;

pub fn pipeline(db: &TestDb) -> Pipeline {
    CommandPipeline::new(db.store(), PipelineConfig::default())
}

pub fn pipeline_with(db: &TestDb, config: PipelineConfig) -> Pipeline {
    CommandPipeline::new(db.store(), config)
}

pub fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).expect("valid")
}

pub fn routed() -> LeaseFacts {
    LeaseFacts {
        backend: Some(ServiceName::parse("backend", "docker-1").expect("valid")),
        ..LeaseFacts::default()
    }
}

/// A command from `tenant` on `lease` under `key`.
pub fn request(
    tenant: &str,
    lease: LeaseId,
    key: &str,
    command: LeaseCommand,
    facts: LeaseFacts,
) -> CommandRequest<Lease> {
    let actor = Actor { subject: format!("{tenant}-user"), role: "tenant".into() };
    let key = OperationKey::parse(key).expect("valid");
    CommandRequest::new(self::tenant(tenant), actor, lease.stream_id(), key, command, facts)
}

pub fn provision(lease: LeaseId, payload: u8) -> LeaseCommand {
    let input = RequestLeaseInput {
        provider_id: Uuid::from_u128(7).to_string(),
        items: vec![
            ItemInput {
                sku: "gpu.h100.1x".into(),
                quantity: 1,
                service_name: Some("trainer".into()),
            },
            ItemInput {
                sku: "cpu.standard.4x".into(),
                quantity: 2,
                service_name: Some("web".into()),
            },
        ],
        payload_hash: format!("{payload:02x}").repeat(32),
    };
    let limits = LeaseInputLimits::default();
    lease_input::request_provision(lease, operation_of(lease), &input, limits).expect("valid input")
}

/// The operation a lease's first provision (or restore) is given in these tests.
pub fn operation_of(lease: LeaseId) -> OperationId {
    OperationId(lease.0)
}

/// The backend's report that the lease's first provision (or restore) is done.
pub fn provisioned(lease: LeaseId) -> LeaseCommand {
    LeaseCommand::ReportProvisioned { operation: operation_of(lease) }
}

pub fn new_lease() -> LeaseId {
    LeaseId(Uuid::now_v7())
}

/// A lease of tenant `tenant`, requested and reported provisioned.
pub async fn ready_lease(pipeline: &Pipeline, tenant: &str) -> LeaseId {
    let lease = new_lease();
    let key = format!("req-{}", lease.0.simple());
    pipeline
        .execute(request(tenant, lease, &key, provision(lease, 1), routed()))
        .await
        .expect("requested");
    let key = format!("up-{}", lease.0.simple());
    pipeline
        .execute(request(tenant, lease, &key, provisioned(lease), LeaseFacts::default()))
        .await
        .expect("provisioned");
    lease
}

/// Every event of the lease's stream.
pub async fn events_of(db: &TestDb, lease: LeaseId) -> Vec<RecordedEvent> {
    db.store().read_stream(&lease.stream_id(), 1, 10_000).await.expect("readable")
}

/// The event types of the lease's stream, in order.
pub async fn types_of(db: &TestDb, lease: LeaseId) -> Vec<String> {
    events_of(db, lease).await.iter().map(|e| e.event_type.to_string()).collect()
}
