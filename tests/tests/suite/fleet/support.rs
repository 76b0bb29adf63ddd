//! Givens for the fleet's tests: hosts registered by an operator, VM services over their
//! streams, specs, and the log's own account of every host's allocation.

use std::collections::BTreeMap;

use leasehold_adapters::PgEventStore;
use leasehold_adapters::vault::PgCredentialVault;
use leasehold_commands::host_service::{HostCaller, HostService};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::vm_service::{StreamCatalog, VmService};
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::host::{Allocation, Host, HostCapacity, HostEvent, HostSpec};
use leasehold_domain::values::fleet::{AgentUrl, Arch, HostBackend, HostId, Labels, TaskId};
use leasehold_domain::vm::{PlacementPolicy, VmSpec};
use leasehold_domain::{Actor, Aggregate, DomainEvent, EventStore as _, TenantId};
use leasehold_tests::TestDb;

pub type Service = VmService<PgEventStore, StreamCatalog<PgEventStore>, PgCredentialVault>;

/// The key the tests' vaults seal VM credentials under.
pub const VAULT_KEY: &[u8] = b"test-vm-credentials-key-0123456789abcdef";

pub fn host_id(name: &str) -> HostId {
    HostId::parse("host", name).expect("valid")
}

pub fn task(name: &str) -> TaskId {
    TaskId::parse("task", name).expect("valid")
}

pub fn operator() -> HostCaller {
    HostCaller { actor: Actor { subject: "ops".into(), role: "operator".into() }, namespace: None }
}

pub fn tenant(name: &str) -> Caller {
    Caller {
        actor: Actor { subject: format!("{name}-user"), role: "tenant".into() },
        tenant: Some(TenantId::parse(name).expect("valid")),
        provider: None,
        namespace: None,
    }
}

pub fn agent() -> Caller {
    Caller {
        actor: Actor { subject: "agent-1".into(), role: "agent".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

/// A host of `cpus` vCPUs and room for `vm_count` VMs, 64 GiB, 1000 GB, labelled zone=a.
pub fn host_spec(backend: HostBackend, cpus: u32, vm_count: u32) -> HostSpec {
    HostSpec {
        url: AgentUrl::parse("url", "http://127.0.0.1:8090").expect("valid"),
        region: None,
        backend,
        labels: Labels::parse("labels", [("zone", "a")]).expect("valid"),
        capacity: HostCapacity {
            cpus,
            ram_mb: 65_536,
            storage_gb: 1_000,
            vm_count,
            arch: Arch::amd64(),
            gpus: 0,
            gpu_kind: None,
            mig_profiles: BTreeMap::new(),
            mig_instances: Vec::new(),
        },
    }
}

pub async fn register(db: &TestDb, name: &str, spec: HostSpec) {
    let hosts = HostService::new(CommandPipeline::new(db.store(), PipelineConfig::default()));
    hosts
        .register(&operator(), &format!("register-{name}"), &host_id(name), spec)
        .await
        .expect("registered");
}

/// A VM service of its own (as another process would be) placing by `policy` over `hosts`.
pub fn service(db: &TestDb, hosts: &[&str], policy: PlacementPolicy) -> Service {
    let pipeline = CommandPipeline::new(db.store(), PipelineConfig::default());
    let catalog = StreamCatalog::new(pipeline.clone(), hosts.iter().map(|h| host_id(h)).collect());
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    VmService::new(pipeline, (catalog, vault), policy)
}

/// No secrets for a VM.
pub fn no_secrets() -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::new()
}

/// 2 vCPUs, 2 GiB, 10 GB, no GPU, booting the default image.
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

/// The host as its stream holds it, with the allocation after every one of its events:
/// `Err` names the first event after which allocation exceeded capacity.
pub async fn replay_host(db: &TestDb, name: &str) -> (Host, Result<usize, String>) {
    let events =
        db.store().read_stream(&host_id(name).stream_id(), 1, 10_000).await.expect("readable");
    let mut host = Host::initial();
    let mut checked = Ok(events.len());
    for recorded in &events {
        let event = HostEvent::from_stored(recorded.event_type.as_str(), &recorded.payload)
            .expect("decodable");
        host = host.evolve(&event);
        let capacity = &host.spec.as_ref().expect("registered").capacity;
        let used: &Allocation = &host.allocated;
        let over = used.cpus > u64::from(capacity.cpus)
            || used.ram_mb > capacity.ram_mb
            || used.storage_gb > capacity.storage_gb
            || used.vm_count > capacity.vm_count;
        if over && checked.is_ok() {
            checked =
                Err(format!("over capacity after {} (v{})", event.event_type(), recorded.version));
        }
        assert_eq!(host.allocated, Allocation::of(host.reservations.values()));
    }
    (host, checked)
}

/// A tenant's ask for a manual snapshot of `vm`, of the `requested` kind, with nothing else set.
pub fn snapshot_ask(
    vm: leasehold_domain::values::fleet::VmId,
    requested: leasehold_domain::snapshot::RequestedKind,
) -> leasehold_commands::snapshot_service::CreateSnapshot {
    leasehold_commands::snapshot_service::CreateSnapshot {
        vm,
        requested,
        mode: leasehold_domain::snapshot::SnapshotMode::Manual,
        parent: None,
        layer_key: None,
        name: None,
        retention_until: None,
    }
}
