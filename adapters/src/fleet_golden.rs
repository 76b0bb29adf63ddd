//! Golden bytes of the fleet's stored states (snapshots and projection views are postcard,
//! which is positional): a change of the shape of `Vm`, `Host`, `Snapshot` or `SnapshotQuota`
//! fails here until its `STATE_SCHEMA` is bumped and the new version's bytes are recorded
//! beside the old.

use chrono::{TimeZone as _, Utc};
use leasehold_domain::host::{Allocation, Host, HostCapacity, HostSpec, HostStatus, Reservation};
use leasehold_domain::values::fleet::{
    AgentUrl, Arch, GpuKind, HostBackend, HostId, Labels, MigInstance, MigProfile, Region, TaskId,
    VmId,
};
use leasehold_domain::values::{OperationId, OperatorDetail, Reason, ServiceName, TenantMessage};
use leasehold_domain::vm::{
    BootFailure, CredentialRef, DestroyReason, ExposedPort, GuestPath, ImageName, Migration,
    Placement, PlacementPolicy, Protocol, SnapshotRef, StrikeReason, TaskStatus, Vm, VmOrigin,
    VmOutcome, VmSpec, VmStatus, VmTerms, VmUrl,
};
use leasehold_domain::{Aggregate, TenantId};
use uuid::Uuid;

const VM_STATE_GOLDEN: &[(u32, &str)] =
    &[(1, include_str!("golden/vm_state_v1.hex")), (2, include_str!("golden/vm_state_v2.hex"))];
const HOST_STATE_GOLDEN: &[(u32, &str)] = &[(1, include_str!("golden/host_state_v1.hex"))];
const SNAPSHOT_STATE_GOLDEN: &[(u32, &str)] = &[
    (1, include_str!("golden/snapshot_state_v1.hex")),
    (2, include_str!("golden/snapshot_state_v2.hex")),
    (3, include_str!("golden/snapshot_state_v3.hex")),
];
const QUOTA_STATE_GOLDEN: &[(u32, &str)] = &[(1, include_str!("golden/quota_state_v1.hex"))];

fn at(seconds: i64) -> chrono::DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0).single().expect("valid")
}

fn host_id() -> HostId {
    HostId::parse("host", "agent-1").expect("valid")
}

fn vm() -> (TenantId, Vm) {
    let spec = VmSpec {
        cpus: 2,
        ram_mb: 2_048,
        storage_gb: 10,
        region: Some(Region::parse("r", "eu-west-1").expect("valid")),
        arch: Some(Arch::amd64()),
        gpus: 1,
        gpu_kind: Some(GpuKind::parse("g", "a100").expect("valid")),
        gpu_profile: Some(MigProfile::parse("p", "1g.10gb").expect("valid")),
        pin: Some(host_id()),
        labels: Labels::parse("l", [("zone", "a")]).expect("valid"),
        max_runtime_seconds: Some(3_600),
        idle_timeout_seconds: Some(600),
        image: Some(ImageName::parse("i", "ubuntu-24.04").expect("valid")),
        seed: Some(SnapshotRef::parse("s", "snap-1-abc").expect("valid")),
        resume_seed: true,
        huge_pages: true,
        egress_proxy: Some(ServiceName::parse("e", "squid").expect("valid")),
        startup_script_timeout_seconds: Some(30),
        guest_files: vec![GuestPath::parse("f", "/etc/app.conf").expect("valid")],
        expose: vec![ExposedPort {
            port: 8080,
            name: ServiceName::parse("n", "web").expect("valid"),
            protocol: Protocol::Udp,
        }],
    };
    let state = Vm {
        status: VmStatus::Removed,
        outcome: Some(VmOutcome::Failed),
        terms: Some(VmTerms {
            id: VmId(Uuid::from_u128(1)),
            task: TaskId::parse("t", "build-1").expect("valid"),
            spec,
            credentials: CredentialRef(Uuid::from_u128(2)),
            created_at: at(0),
        }),
        task: Some(TaskStatus::Failed),
        placement: Some(Placement {
            host: host_id(),
            policy: PlacementPolicy::Pack,
            candidates: 3,
            headroom_cpus: -1,
            headroom_ram_mb: 1_024,
            artifact_local: true,
            retries: 2,
        }),
        url: Some(VmUrl::parse("u", "10.0.0.5:19551").expect("valid")),
        operation: Some(OperationId(Uuid::from_u128(3))),
        generation: 2,
        destroy_reason: Some(DestroyReason::Idle),
        failure: Some(BootFailure {
            reason: Reason::parse("r", "BootFailed").expect("valid"),
            message: TenantMessage::parse("m", "could not boot").expect("valid"),
            detail: OperatorDetail::new("500"),
        }),
        strikes: Some((StrikeReason::Stuck, 1)),
        running_since: Some(at(1)),
        last_activity: Some(at(2)),
        updated_at: Some(at(3)),
        origin: Some(VmOrigin::Migration {
            source: VmId(Uuid::from_u128(4)),
            live: true,
            lazy: false,
            running_since: Some(at(1)),
        }),
        migration: Some(Migration {
            to: VmId(Uuid::from_u128(5)),
            target: HostId::parse("host", "agent-2").expect("valid"),
            live: false,
            lazy: true,
        }),
    };
    (TenantId::parse("acme").expect("valid"), state)
}

fn host() -> (TenantId, Host) {
    let profile = MigProfile::parse("p", "1g.10gb").expect("valid");
    let reservation = Reservation {
        cpus: 2,
        ram_mb: 2_048,
        storage_gb: 10,
        gpus: 1,
        mig: Some((profile.clone(), 1)),
        mig_instances: vec!["MIG-a".into()],
    };
    let state = Host {
        status: HostStatus::Cordoned,
        id: Some(host_id()),
        spec: Some(HostSpec {
            url: AgentUrl::parse("u", "https://agent-1.local:8443").expect("valid"),
            region: Some(Region::parse("r", "eu-west-1").expect("valid")),
            backend: HostBackend::Qemu,
            labels: Labels::parse("l", [("zone", "a")]).expect("valid"),
            capacity: HostCapacity {
                cpus: 16,
                ram_mb: 65_536,
                storage_gb: 1_000,
                vm_count: 4,
                arch: Arch::amd64(),
                gpus: 2,
                gpu_kind: Some(GpuKind::parse("g", "a100").expect("valid")),
                mig_profiles: [(profile.clone(), 2)].into(),
                mig_instances: vec![MigInstance {
                    uuid: "MIG-a".into(),
                    profile,
                    kind: GpuKind::parse("g", "a100").expect("valid"),
                }],
            },
        }),
        allocated: Allocation::of([&reservation]),
        reservations: [(VmId(Uuid::from_u128(1)), reservation)].into(),
        last_seen: Some(at(4)),
        updated_at: Some(at(5)),
    };
    (leasehold_domain::values::fleet::fleet_tenant(), state)
}

pub(crate) fn check<T>(name: &str, schema: u32, golden: &[(u32, &str)], value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let encoded = hex::encode(postcard::to_stdvec(value).expect("encodes"));
    let recorded = golden.iter().find(|(version, _)| *version == schema).map(|(_, b)| b.trim());
    assert_eq!(
        recorded,
        Some(encoded.as_str()),
        "the stored shape of {name} changed (or schema {schema} has no golden bytes): bump its \
         STATE_SCHEMA and add adapters/src/golden/{}_state_v<N>.hex with these bytes, keeping \
         the old file",
        name.to_lowercase()
    );
    let decoded: T = postcard::from_bytes(&hex::decode(&encoded).expect("hex")).expect("decodes");
    assert_eq!(&decoded, value);
}

#[test]
fn the_vm_state_keeps_its_stored_shape_for_its_schema() {
    check("Vm", Vm::STATE_SCHEMA, VM_STATE_GOLDEN, &vm());
}

#[test]
fn the_host_state_keeps_its_stored_shape_for_its_schema() {
    check("Host", Host::STATE_SCHEMA, HOST_STATE_GOLDEN, &host());
}

/// A snapshot with every optional field present.
fn snapshot() -> (TenantId, leasehold_domain::snapshot::Snapshot) {
    use leasehold_domain::snapshot::{
        DeleteCause, Digest, Export, ExportDestination, ExportStatus, LayerKey, ReportedSizes,
        RequestedKind, Snapshot, SnapshotId, SnapshotKind, SnapshotMode, SnapshotName,
        SnapshotStatus, SnapshotTerms, Written,
    };
    let state = Snapshot {
        status: SnapshotStatus::Error,
        terms: Some(SnapshotTerms {
            snapshot: SnapshotId(Uuid::from_u128(1)),
            vm: VmId(Uuid::from_u128(2)),
            task: TaskId::parse("t", "build-1").expect("valid"),
            host: host_id(),
            arch: Arch::amd64(),
            mode: SnapshotMode::Build,
            requested: RequestedKind::Live,
            parent: Some(SnapshotId(Uuid::from_u128(3))),
            layer_key: Some(LayerKey::parse("l", "step:abc").expect("valid")),
            name: Some(SnapshotName::parse("n", "base").expect("valid")),
            retention_until: Some(at(9)),
            estimate_bytes: 10,
        }),
        written: Some(Written {
            kind: SnapshotKind::Live,
            sizes: ReportedSizes { disk_bytes: 10, memory_bytes: 5 },
            digest: Some(Digest::parse("d", "ab".repeat(32)).expect("valid")),
            store_ref: SnapshotRef::parse("r", "snap-1-a").expect("valid"),
            diff_of: Some(SnapshotId(Uuid::from_u128(3))),
        }),
        size_bytes: 15,
        operation: Some(OperationId(Uuid::from_u128(4))),
        deletion: Some(DeleteCause::Gc),
        gc_failures: 2,
        exports: vec![Export {
            destination: ExportDestination::parse("e", "s3://bucket/key").expect("valid"),
            status: ExportStatus::Error,
            requested_at: at(1),
            updated_at: at(2),
            last_error: Some(OperatorDetail::new("403")),
            operation: Some(OperationId(Uuid::from_u128(6))),
        }],
        last_error: Some(OperatorDetail::new("500")),
        created_at: Some(at(0)),
        last_used: Some(at(3)),
        updated_at: Some(at(4)),
        children: [SnapshotId(Uuid::from_u128(5))].into(),
    };
    (TenantId::parse("acme").expect("valid"), state)
}

/// A tenant's quota with limits and a reservation.
fn quota() -> (TenantId, leasehold_domain::quota::SnapshotQuota) {
    use leasehold_domain::quota::{QuotaLimits, QuotaUsage, SnapshotQuota};
    use leasehold_domain::snapshot::SnapshotId;
    let state = SnapshotQuota {
        limits: QuotaLimits { max_count: 5, max_bytes: 100 },
        reservations: [(SnapshotId(Uuid::from_u128(1)), 10)].into(),
        usage: QuotaUsage { count: 1, bytes: 10 },
        updated_at: Some(at(1)),
    };
    (TenantId::parse("acme").expect("valid"), state)
}

#[test]
fn the_snapshot_state_keeps_its_stored_shape_for_its_schema() {
    use leasehold_domain::snapshot::Snapshot;
    check("Snapshot", Snapshot::STATE_SCHEMA, SNAPSHOT_STATE_GOLDEN, &snapshot());
}

#[test]
fn the_quota_state_keeps_its_stored_shape_for_its_schema() {
    use leasehold_domain::quota::SnapshotQuota;
    check("Quota", SnapshotQuota::STATE_SCHEMA, QUOTA_STATE_GOLDEN, &quota());
}
