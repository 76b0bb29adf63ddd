//! Givens for the rented-capacity tests: services over one test database, callers, a
//! rental brought to active by its provider's reports, and its node enrolled.

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use leasehold_adapters::PgEventStore;
use leasehold_commands::enrollment::{EnrollmentKey, NodeSession, node_of};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::node_service::{Enrollment, NodeService, Presented};
use leasehold_commands::rental_service::{
    Connections, ProvisionRental, RentalConfig, RentalService,
};
use leasehold_commands::run_service::RunService;
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::node::{AgentVersion, FactText, NodeFacts, NodeId};
use leasehold_domain::rental::{
    CapacityObservation, CapacityReceipt, CapacityState, CapacitySupport, ConnectionId,
    IdempotentProvision, NativeRef, OfferId, Pricing, RentalId, Resources,
};
use leasehold_domain::{Actor, EventStore as _, RecordedEvent, StreamId, TenantId};
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;

pub type Pipeline = CommandPipeline<PgEventStore>;

pub const SECRET: &[u8] = b"an enrollment key of at least 32 bytes, for tests";

pub fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0).single().expect("a valid time")
}

pub fn key() -> EnrollmentKey {
    EnrollmentKey::new(SECRET).expect("long enough")
}

pub fn connection() -> ConnectionId {
    ConnectionId::parse("connection", "sim").expect("valid")
}

pub fn support() -> CapacitySupport {
    CapacitySupport {
        stop: true,
        resume: true,
        persistent_disk: true,
        spot: false,
        exact_pricing: true,
        idempotent_provision: IdempotentProvision::OperationKey,
        list_owned: true,
        observe_after_terminate: false,
    }
}

/// The services of one process over `db`, on `clock`.
pub struct Services {
    pub rentals: RentalService<PgEventStore>,
    pub nodes: NodeService<PgEventStore>,
    pub runs: RunService<PgEventStore>,
}

impl Services {
    /// The run service's pipeline, for commands sent as a stale dispatcher would.
    pub fn runs_pipeline(&self) -> &Pipeline {
        self.runs.pipeline()
    }
}

pub fn pipeline(db: &TestDb, clock: &Arc<ManualClock>) -> Pipeline {
    let config = PipelineConfig { retries_max: 64, ..PipelineConfig::default() };
    CommandPipeline::new(db.store(), config).with_clock(clock.clone())
}

pub fn services(db: &TestDb, clock: &Arc<ManualClock>) -> Services {
    Services {
        rentals: RentalService::new(pipeline(db, clock), rental_config()),
        nodes: NodeService::new(pipeline(db, clock), key()),
        runs: RunService::new(pipeline(db, clock)),
    }
}

/// The rental service's configuration: the `sim` connection, this file's enrollment key.
pub fn rental_config() -> RentalConfig {
    let mut connections = Connections::default();
    connections.register(connection(), support()).expect("a valid declaration");
    RentalConfig {
        connections,
        control_plane_url: "https://leasehold.test".into(),
        agent_version: "1.0.0".into(),
        key: key(),
    }
}

pub fn tenant(name: &str) -> Caller {
    Caller {
        actor: Actor { subject: name.into(), role: "tenant".into() },
        tenant: Some(TenantId::parse(name).expect("valid")),
        provider: None,
        namespace: None,
    }
}

pub fn provider() -> Caller {
    Caller {
        actor: Actor { subject: "provider:sim".into(), role: "agent".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

pub fn ask() -> ProvisionRental {
    ProvisionRental {
        connection: connection(),
        offer: OfferId::parse("offer", "gpu-1x").expect("valid"),
        resources: Resources { cpu_millis: 4_000, memory_mb: 16_384, disk_gb: 100, gpus: 1 },
        interruptible: false,
        max_lifetime_seconds: 86_400,
    }
}

pub fn native() -> NativeRef {
    NativeRef::parse("native", "m-1").expect("valid")
}

pub fn looked(state: CapacityState, at: DateTime<Utc>) -> CapacityObservation {
    CapacityObservation {
        native_ref: native(),
        state,
        state_since: Some(at),
        observed_at: at,
        interrupted: false,
    }
}

/// A rental of `tenant`'s, accepted and observed active.
pub async fn active_rental(services: &Services, tenant_name: &str, key: &str) -> RentalId {
    let rentals = &services.rentals;
    let rental =
        rentals.provision(&tenant(tenant_name), key, &ask()).await.expect("provisioned").rental;
    let receipt = CapacityReceipt {
        native_ref: native(),
        state: CapacityState::Requested,
        accepted_at: start(),
        duplicate: false,
        interruptible: false,
        pricing: Pricing { currency: "USD".into(), micros_per_hour: 900_000, exact: true },
    };
    let provider = provider();
    rentals
        .accept(&provider, &format!("{key}-accept"), &connection(), (rental, 1, receipt))
        .await
        .expect("accepted");
    let active = looked(CapacityState::Active, start());
    rentals
        .observe(&provider, &format!("{key}-active"), &connection(), (rental, 1, active))
        .await
        .expect("observed");
    rental
}

pub fn facts() -> NodeFacts {
    NodeFacts {
        observed_at: start() + chrono::TimeDelta::hours(6), // a node clock hours ahead
        os: FactText::parse("os", "linux").expect("valid"),
        architecture: FactText::parse("arch", "amd64").expect("valid"),
        container_runtime: FactText::parse("rt", "docker 27").expect("valid"),
        cpu_millis: 4_000,
        memory_bytes: 16 << 30,
        disk_free_bytes: None,
        images: Vec::new(),
    }
}

pub fn agent_version() -> AgentVersion {
    AgentVersion::parse("agent", "1.0.0").expect("valid")
}

/// The first enrollment of `rental`'s generation-1 node, with its bootstrap's token.
pub async fn enroll(services: &Services, rental: RentalId) -> Enrollment {
    let node = node_of(rental, 1);
    let token = key().enrollment_token(node);
    let presented = Presented::Token { token: &token, rental, generation: 1 };
    services.nodes.enroll(node, presented, (agent_version(), facts())).await.expect("enrolled")
}

pub fn session_of(services: &Services, enrollment: &Enrollment) -> NodeSession {
    services.nodes.session(&enrollment.credential).expect("a valid credential")
}

pub fn node1(rental: RentalId) -> NodeId {
    node_of(rental, 1)
}

/// Every event of `stream`, in version order.
pub async fn events_of(db: &TestDb, stream: &StreamId) -> Vec<RecordedEvent> {
    db.store().read_stream(stream, 1, 10_000).await.expect("readable")
}

/// How long a rented test waits for a reconciler to act.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits (bounded by [`WAIT`], polling every 20 ms) until `check` finds what it looks for.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let found = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(found) = check().await {
                return found;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    found.await.unwrap_or_else(|_| panic!("{what}: not in {WAIT:?}"))
}

pub use crate::support::log_len;

/// Every event of the whole log, as JSON text (payloads and metadata).
///
/// Every committed row, read from the table: the log's readers stop at the horizon, which a
/// commit a moment old may not have passed yet (a "before" read through them missed the last
/// event, and a later one then seemed to have appended it).
pub async fn whole_log_text(db: &TestDb) -> String {
    let rows = db
        .client()
        .await
        .query(
            "SELECT payload::text, metadata::text FROM events \
             ORDER BY log_epoch, tx_id, position",
            &[],
        )
        .await
        .expect("readable");
    rows.iter()
        .map(|row| format!("{} {}\n", row.get::<_, String>(0), row.get::<_, String>(1)))
        .collect()
}
