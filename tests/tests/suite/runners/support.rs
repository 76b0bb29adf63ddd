//! Givens for the runner lease tests: services over one test database (each a process of
//! its own), callers, a tenant's request, a node registered, a lease brought to busy.

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use leasehold_adapters::PgEventStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::runner_service::{HolderReport, RequestRunner, RunnerService};
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::runner::{
    GuestOs, JobRef, JobRequestId, Phase, ProviderKind, RunnerLeaseId, RunnerNodeName,
    RunnerResources, StartCommand, Tier, TrustClass,
};
use leasehold_domain::runner_node::Registration;
use leasehold_domain::{Actor, TenantId};
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;
use uuid::Uuid;

pub type Service = RunnerService<PgEventStore>;

pub fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).single().expect("a valid time")
}

/// A service of its own, as another process's would be (nothing remembered in common), that
/// keeps deciding again after lost races long enough for sixteen contenders.
pub fn process(db: &TestDb, clock: &Arc<ManualClock>) -> Service {
    let config = PipelineConfig { retries_max: 64, ..PipelineConfig::default() };
    RunnerService::new(CommandPipeline::new(db.store(), config).with_clock(clock.clone()))
}

pub fn clock() -> Arc<ManualClock> {
    ManualClock::at(start())
}

pub fn acme() -> TenantId {
    TenantId::parse("acme").expect("valid")
}

pub fn tenant(name: &str) -> Caller {
    Caller {
        actor: Actor { subject: name.into(), role: "tenant".into() },
        tenant: Some(TenantId::parse(name).expect("valid")),
        provider: None,
        namespace: None,
    }
}

pub fn machine(subject: &str) -> Caller {
    Caller {
        actor: Actor { subject: subject.into(), role: "agent".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

pub fn operator() -> Caller {
    Caller {
        actor: Actor { subject: "ops".into(), role: "operator".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

pub fn tier() -> Tier {
    Tier::parse("tier", "linux-4x").expect("valid")
}

pub fn ask() -> RequestRunner {
    RequestRunner {
        tier: tier(),
        trust: TrustClass::Trusted,
        guest_os: GuestOs::Linux,
        resources: RunnerResources::new("resources", 4, 8_192).expect("valid"),
        providers: vec![ProviderKind::Docker],
        command: StartCommand::parse("command", vec!["./run.sh".into()]).expect("valid"),
        ttl_seconds: 90,
    }
}

pub fn job(n: u128) -> JobRef {
    JobRef { request: JobRequestId(Uuid::from_u128(0x900 + n)), run: 7 }
}

pub fn node_name() -> RunnerNodeName {
    RunnerNodeName::parse("node", "docker-1").expect("valid")
}

pub fn registration() -> Registration {
    Registration {
        node: node_name(),
        provider: ProviderKind::Docker,
        guest_os: vec![GuestOs::Linux],
        accepts: vec![TrustClass::Trusted, TrustClass::Untrusted],
        vcpu: 64,
        memory_mb: 262_144,
    }
}

/// A lease of acme's requested under `key`.
pub async fn requested(service: &Service, key: &str) -> RunnerLeaseId {
    service.request(&tenant("acme"), key, &ask()).await.expect("requested").lease
}

/// A lease of acme's assigned job `n`, launched on the node (registered first if it is not),
/// online, then busy.
pub async fn busy(service: &Service, key: &str, n: u128) -> RunnerLeaseId {
    if service.node(&node_name()).await.expect("readable").is_none() {
        let register = (registration(), None);
        let node = machine("node:docker-1");
        service.register_node(&node, "register", register).await.expect("registered");
    }
    let lease = requested(service, key).await;
    service
        .assign(&tenant("acme"), &format!("{key}-assign"), (lease, 1, job(n)))
        .await
        .expect("assigned");
    let dispatcher = machine("system:dispatcher");
    let owned = (acme(), lease, 1);
    service
        .launch(&dispatcher, &format!("{key}-launch"), owned, node_name())
        .await
        .expect("launched");
    for phase in [Phase::Online, Phase::Busy] {
        let report = HolderReport::Phase { epoch: 1, phase };
        let key = format!("{key}-{}", phase.name());
        service
            .report(&machine("node:docker-1"), &key, (acme(), lease), report)
            .await
            .expect("advanced");
    }
    lease
}
