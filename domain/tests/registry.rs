//! The registry walked whole: every event type of every kind is registered once, and every
//! field of every event type was decided for tenants (shown or withheld on purpose); what
//! nobody decided, tenants never see.

use std::collections::{BTreeSet, HashSet};

use chrono::{TimeZone, Utc};
use leasehold_domain::lease::{
    CloseCause, HostName, LeaseEvent as E, LeaseId, LeaseItem, LeaseItems, MaintenanceId,
    OperationId, OperatorDetail, PayloadHash, ProviderId, ReapCause, Reason, ServiceName, Sku,
    TenantMessage, TerminalVerdict,
};
use leasehold_domain::registry::{self, KINDS};
use leasehold_domain::{Aggregate, DomainEvent};
use serde_json::json;
use uuid::Uuid;

#[path = "registry/rented.rs"]
mod rented;
#[path = "registry/runners.rs"]
mod runners;

/// One event of every lease event type, every optional field present.
fn lease_samples() -> Vec<E> {
    let at = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time");
    let id = |n: u128| LeaseId(Uuid::from_u128(n));
    let items = LeaseItems::new(vec![LeaseItem {
        sku: Sku::parse("sku", "gpu.h100.1x").expect("valid"),
        quantity: 1,
        service_name: Some(ServiceName::parse("s", "web").expect("valid")),
        custom_domain: Some(HostName::parse("d", "app.example.com").expect("valid")),
    }])
    .expect("valid");
    let hash = || PayloadHash::parse("h", "ab".repeat(32)).expect("valid");
    let backend = || ServiceName::parse("b", "east").expect("valid");
    let (reason, message, detail) = (
        || Reason::parse("r", "ImagePullFailed").expect("valid"),
        || TenantMessage::parse("m", "failed").expect("valid"),
        || OperatorDetail::new("registry.internal: 401"),
    );
    let maintenance_id = MaintenanceId(Uuid::from_u128(9));
    let operation = Some(OperationId(Uuid::from_u128(8)));
    let provider = ProviderId(Uuid::from_u128(7));
    vec![
        E::LeaseProvisionRequested {
            lease: id(1),
            provider,
            items: items.clone(),
            payload_hash: hash(),
            backend: backend(),
            generation: 1,
            release: 1,
            at,
            operation,
        },
        E::LeaseProvisioned { release: Some(1), at },
        E::LeaseActivated { at },
        E::LeaseProvisionFailed {
            reason: reason(),
            message: message(),
            detail: detail(),
            release: Some(1),
            at,
        },
        E::LeaseRejected { at },
        E::LeaseFailing { detail: detail(), at },
        E::LeaseFailed { reason: reason(), message: message(), detail: detail(), at },
        E::LeaseRestartStarted { maintenance_id, admitted_at: at, generation: 2 },
        E::LeaseUpdateStarted {
            maintenance_id,
            admitted_at: at,
            generation: 2,
            payload_hash: hash(),
            release: 2,
        },
        E::LeaseMaintenanceSucceeded { maintenance_id, release: Some(2), at },
        E::LeaseMaintenanceRecovered {
            maintenance_id,
            reason: reason(),
            message: message(),
            detail: detail(),
            release: Some(2),
            at,
        },
        E::LeaseMaintenanceFailed {
            maintenance_id,
            reason: reason(),
            message: message(),
            detail: detail(),
            release: Some(2),
            at,
        },
        E::LeaseDeprovisionRequested { generation: 3, at },
        E::LeaseDeprovisioned { retained: true, retained_until: Some(at), at },
        E::LeaseRestoreStarted {
            lease: id(2),
            from: id(1),
            provider,
            items,
            backend: backend(),
            generation: 1,
            at,
            operation,
        },
        E::LeaseRetentionRestoring { into: id(2), at },
        E::LeaseRetentionRestoreRolledBack { into: id(2), at },
        E::LeaseRetentionConsumed { into: id(2), at },
        E::LeaseRetentionReaping { cause: ReapCause::GraceExpired, at },
        E::LeaseRetentionDeleted { at },
        E::LeaseCustomDomainSet {
            service: Some(ServiceName::parse("s", "web").expect("valid")),
            domain: Some(HostName::parse("d", "app.example.com").expect("valid")),
            at,
        },
        E::LeaseTerminalBudgetObserved {
            verdict: TerminalVerdict::Exhausted,
            consecutive_failures: 3,
            at,
        },
        E::LeaseClosedForFailure { consecutive_failures: 3, at },
        E::LeaseClosed { cause: CloseCause::Tenant, at },
        E::LeaseExpired { at },
        E::LeaseDispatched { generation: 2, attempt: 1, at },
        E::LeaseDispatchFailed {
            generation: 2,
            attempt: 3,
            detail: OperatorDetail::new("connect 10.0.0.5:9000: refused"),
            at,
        },
    ]
}

#[test]
fn every_event_type_is_registered_once_across_every_kind() {
    let mut stream_types = HashSet::new();
    let mut event_types = HashSet::new();
    for kind in KINDS {
        assert!(stream_types.insert(kind.stream_type), "stream type {} twice", kind.stream_type);
        for event_type in kind.event_types() {
            assert!(event_types.insert(event_type), "event type {event_type} registered twice");
        }
    }
    // The lease kind registers exactly the event types its decoder reads.
    let registered: BTreeSet<_> = leasehold_domain::lease::KIND.event_types().collect();
    let decoded: BTreeSet<_> = E::TYPES.into_iter().collect();
    assert_eq!(registered, decoded);
    assert_eq!(
        leasehold_domain::lease::Lease::STREAM_TYPE,
        leasehold_domain::lease::KIND.stream_type
    );
    assert!(registry::kind("lease").is_some());
}

/// One event of every VM event type, every optional field present.
fn vm_samples() -> Vec<(&'static str, serde_json::Value)> {
    use leasehold_domain::values::fleet::{
        Arch, GpuKind, HostId, Labels, MigProfile, Region, TaskId, VmId,
    };
    use leasehold_domain::vm::{
        CopyKind, CredentialRef, DestroyReason, ExposedPort, GuestPath, ImageName, Placement,
        PlacementPolicy, Protocol, SnapshotRef, StrikeReason, VmEvent as V, VmSpec, VmUrl,
    };
    let at = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time");
    let host = HostId::parse("h", "agent-1").expect("valid");
    let spec = VmSpec {
        cpus: 2,
        ram_mb: 2_048,
        storage_gb: 10,
        region: Some(Region::parse("r", "eu-west-1").expect("valid")),
        arch: Some(Arch::amd64()),
        gpus: 1,
        gpu_kind: Some(GpuKind::parse("g", "a100").expect("valid")),
        gpu_profile: Some(MigProfile::parse("p", "1g.10gb").expect("valid")),
        pin: Some(host.clone()),
        labels: Labels::parse("l", [("zone", "a")]).expect("valid"),
        max_runtime_seconds: Some(3_600),
        idle_timeout_seconds: Some(600),
        image: Some(ImageName::parse("i", "ubuntu-24.04").expect("valid")),
        seed: Some(SnapshotRef::parse("s", "snap-1-abc").expect("valid")),
        resume_seed: false,
        huge_pages: true,
        egress_proxy: Some(ServiceName::parse("e", "squid").expect("valid")),
        startup_script_timeout_seconds: Some(30),
        guest_files: vec![GuestPath::parse("f", "/etc/app.conf").expect("valid")],
        expose: vec![ExposedPort {
            port: 8080,
            name: ServiceName::parse("n", "web").expect("valid"),
            protocol: Protocol::Tcp,
        }],
    };
    let placement = Placement {
        host,
        policy: PlacementPolicy::Spread,
        candidates: 3,
        headroom_cpus: 6,
        headroom_ram_mb: 1_024,
        artifact_local: true,
        retries: 1,
    };
    let operation = OperationId(Uuid::from_u128(8));
    let task = TaskId::parse("t", "build-1").expect("valid");
    let reason = || Reason::parse("r", "BootFailed").expect("valid");
    let events = vec![
        V::VmProvisioning {
            vm: VmId(Uuid::from_u128(1)),
            task: task.clone(),
            spec: Box::new(spec),
            credentials: CredentialRef(Uuid::from_u128(2)),
            at,
        },
        V::TaskAssigned { task, at },
        V::VmScheduled { placement, operation, generation: 1, at },
        V::VmRunning { url: VmUrl::parse("u", "10.0.0.5:19551").expect("valid"), at },
        V::TaskRunning { at },
        V::VmProvisionFailed {
            reason: reason(),
            message: TenantMessage::parse("m", "could not boot").expect("valid"),
            detail: OperatorDetail::new("500 no free VM index"),
            at,
        },
        V::TaskFailed { reason: reason(), at },
        V::TaskCompleted { at },
        V::VmDraining { at },
        V::VmDestroying { reason: DestroyReason::Stuck, operation, generation: 2, at },
        V::VmRemoved { at },
        V::VmStruck { reason: StrikeReason::Idle, strikes: 1, at },
        V::VmStrikesCleared { at },
        V::VmRecovered { running: true, at },
        V::VmActive { at },
        V::VmCopied {
            source: VmId(Uuid::from_u128(3)),
            kind: CopyKind::Migration,
            live: true,
            lazy: true,
            since: Some(at),
            at,
        },
        V::VmForked { fork: VmId(Uuid::from_u128(4)), at },
        V::VmMigrating {
            to: VmId(Uuid::from_u128(4)),
            target: HostId::parse("h", "agent-2").expect("valid"),
            live: true,
            lazy: false,
            at,
        },
        V::VmMigrated { to: VmId(Uuid::from_u128(4)), at },
        V::VmMigrationAbandoned { to: VmId(Uuid::from_u128(4)), at },
    ];
    events.iter().map(|event| (event.event_type(), event.to_payload())).collect()
}

/// One event of every host event type, every optional field present.
fn host_samples() -> Vec<(&'static str, serde_json::Value)> {
    use leasehold_domain::host::{HostCapacity, HostEvent as H, HostSpec, Reservation};
    use leasehold_domain::values::fleet::{
        AgentUrl, Arch, GpuKind, HostBackend, HostId, Labels, MigInstance, MigProfile, Region, VmId,
    };
    let at = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time");
    let profile = MigProfile::parse("p", "1g.10gb").expect("valid");
    let spec = HostSpec {
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
                profile: profile.clone(),
                kind: GpuKind::parse("g", "a100").expect("valid"),
            }],
        },
    };
    let reservation = Reservation {
        cpus: 2,
        ram_mb: 2_048,
        storage_gb: 10,
        gpus: 1,
        mig: Some((profile, 1)),
        mig_instances: vec!["MIG-a".into()],
    };
    let vm = VmId(Uuid::from_u128(1));
    let events = vec![
        H::HostRegistered {
            host: HostId::parse("h", "agent-1").expect("valid"),
            spec: spec.clone(),
            at,
        },
        H::HostRefreshed { spec, at },
        H::HostHeartbeat { at },
        H::HostCordoned { at },
        H::HostDraining { at },
        H::HostUncordoned { at },
        H::HostRemoved { at },
        H::HostCapacityReserved { vm, reservation: reservation.clone(), at },
        H::HostCapacityReleased { vm, reservation, at },
        H::HostOrphanDeadLettered {
            name: "lh-orphan".into(),
            attempts: 5,
            detail: OperatorDetail::new("500"),
            at,
        },
    ];
    events.iter().map(|event| (event.event_type(), event.to_payload())).collect()
}

/// One event of every snapshot event type, every optional field present.
fn snapshot_samples() -> Vec<(&'static str, serde_json::Value)> {
    use leasehold_domain::snapshot::{
        DeleteCause, Digest, ExportDestination, LayerKey, ReportedSizes, RequestedKind,
        SnapshotEvent as S, SnapshotId, SnapshotKind, SnapshotMode, SnapshotName, SnapshotTerms,
        Written,
    };
    use leasehold_domain::values::fleet::{Arch, HostId, TaskId, VmId};
    use leasehold_domain::vm::SnapshotRef;
    let at = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time");
    let operation = OperationId(Uuid::from_u128(8));
    let terms = SnapshotTerms {
        snapshot: SnapshotId(Uuid::from_u128(1)),
        vm: VmId(Uuid::from_u128(2)),
        task: TaskId::parse("t", "build-1").expect("valid"),
        host: HostId::parse("h", "agent-1").expect("valid"),
        arch: Arch::amd64(),
        mode: SnapshotMode::Build,
        requested: RequestedKind::Live,
        parent: Some(SnapshotId(Uuid::from_u128(3))),
        layer_key: Some(LayerKey::parse("l", "step:abc").expect("valid")),
        name: Some(SnapshotName::parse("n", "before upgrade").expect("valid")),
        retention_until: Some(at),
        estimate_bytes: 10,
    };
    let written = Written {
        kind: SnapshotKind::Live,
        sizes: ReportedSizes { disk_bytes: 10, memory_bytes: 5 },
        digest: Some(Digest::parse("d", "ab".repeat(32)).expect("valid")),
        store_ref: SnapshotRef::parse("r", "snap-1-a").expect("valid"),
        diff_of: Some(SnapshotId(Uuid::from_u128(3))),
    };
    let destination = || ExportDestination::parse("e", "s3://bucket/key").expect("valid");
    let detail = || OperatorDetail::new("500");
    let cause = DeleteCause::Gc;
    let events = vec![
        S::SnapshotRequested { terms, operation, at },
        S::SnapshotCreated { written, size_bytes: 15, at },
        S::SnapshotFailed { detail: detail(), at },
        S::SnapshotRestoring { operation, at },
        S::SnapshotRestored { at },
        S::SnapshotRestoreFailed { missing: true, detail: detail(), at },
        S::SnapshotDeleting { cause, operation, at },
        S::SnapshotDeleted { cause, not_found: true, at },
        S::SnapshotDeleteFailed { cause, failures: 1, detail: detail(), at },
        S::SnapshotGcDeadLettered { failures: 5, at },
        S::SnapshotExportRequested { destination: destination(), at, operation: Some(operation) },
        S::SnapshotExported { destination: destination(), at },
        S::SnapshotExportFailed { destination: destination(), detail: detail(), at },
        S::SnapshotUsed { at },
        S::SnapshotChildAdopted { child: SnapshotId(Uuid::from_u128(4)), at },
        S::SnapshotChildReleased { child: SnapshotId(Uuid::from_u128(4)), at },
        S::SnapshotStoodAsLatest { collected: SnapshotId(Uuid::from_u128(4)), at },
    ];
    events.iter().map(|event| (event.event_type(), event.to_payload())).collect()
}

/// One event of every tenant quota event type.
fn quota_samples() -> Vec<(&'static str, serde_json::Value)> {
    use leasehold_domain::quota::{QuotaEvent as Q, QuotaLimits};
    use leasehold_domain::snapshot::SnapshotId;
    let at = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time");
    let snapshot = SnapshotId(Uuid::from_u128(1));
    let events = [
        Q::QuotaLimitsSet { limits: QuotaLimits { max_count: 5, max_bytes: 100 }, at },
        Q::QuotaReserved { snapshot, bytes: 10, at },
        Q::QuotaSettled { snapshot, bytes: 12, at },
        Q::QuotaReleased { snapshot, bytes: 12, at },
    ];
    events.iter().map(|event| (event.event_type(), event.to_payload())).collect()
}

/// One stored payload of every event type of the kind `stream_type`, by event type; `None`
/// for a kind this test has no samples of yet (which fails it: add them here).
fn samples_of(stream_type: &str) -> Option<Vec<(&'static str, serde_json::Value)>> {
    match stream_type {
        "lease" => Some(
            lease_samples().iter().map(|event| (event.event_type(), event.to_payload())).collect(),
        ),
        "vm" => Some(vm_samples()),
        "host" => Some(host_samples()),
        "snapshot" => Some(snapshot_samples()),
        "tenant-quota" => Some(quota_samples()),
        "rental" => Some(rented::rental_samples()),
        "node" => Some(rented::node_samples()),
        "run" => Some(rented::run_samples()),
        "runner-lease" => Some(runners::lease_samples()),
        "runner-capacity" => Some(runners::capacity_samples()),
        "runner-job" => Some(runners::job_samples()),
        "runner-node" => Some(runners::node_samples()),
        "workload-quota" => Some(runners::workload_quota_samples()),
        _ => None,
    }
}

#[test]
fn every_field_of_every_event_of_every_kind_was_decided_for_tenants() {
    for kind in KINDS {
        let samples = samples_of(kind.stream_type)
            .unwrap_or_else(|| panic!("no samples of the {} kind's events", kind.stream_type));
        check_views(kind, &samples);
    }
}

fn check_views(
    kind: &leasehold_domain::AggregateKind,
    samples: &[(&'static str, serde_json::Value)],
) {
    let sampled: BTreeSet<_> = samples.iter().map(|(event_type, _)| *event_type).collect();
    let registered: BTreeSet<_> = kind.event_types().collect();
    assert_eq!(sampled, registered, "a sample of every registered event type");
    // An event type with variants (a node's order) has a sample of each: every declared path
    // must reach a leaf of one of them.
    for event_type in &sampled {
        let view = kind.view(event_type).expect("registered");
        let leaves: BTreeSet<String> = samples
            .iter()
            .filter(|(sampled, _)| sampled == event_type)
            .flat_map(|(_, payload)| leaves_of(payload))
            .collect();
        for path in view.withheld {
            assert!(
                leaves.iter().any(|leaf| is_beneath(leaf, path)),
                "{event_type}: withheld path {path} reaches nothing in the samples"
            );
        }
        for path in view.tenant_fields {
            assert!(leaves.contains(*path), "{event_type}: shown path {path} is not a leaf");
        }
    }
    for (event_type, payload) in samples {
        let view = kind.view(event_type).expect("registered");
        let leaves = leaves_of(payload);
        let shown: BTreeSet<String> = view
            .tenant_fields
            .iter()
            .map(|p| p.to_string())
            .filter(|path| leaves.contains(path))
            .collect();
        for path in view.withheld {
            assert!(
                !view.tenant_fields.iter().any(|leaf| is_beneath(leaf, path)),
                "{event_type}: {path} is both shown and withheld"
            );
        }
        for leaf in &leaves {
            let withheld = view.withheld.iter().any(|path| is_beneath(leaf, path));
            assert!(
                shown.contains(leaf) || withheld,
                "{event_type}: nobody decided whether tenants see {leaf}: list it as shown or \
                 withheld in the kind's registry entry"
            );
        }
        // And the tenant sees exactly the shown leaves.
        let seen = leaves_of(&registry::tenant_view(kind.stream_type, event_type, payload));
        assert_eq!(seen, shown, "{event_type}");
    }
}

/// Every leaf path of a payload (`items[].sku`), elements of arrays merged under `[]`.
fn leaves_of(value: &serde_json::Value) -> BTreeSet<String> {
    let mut leaves = BTreeSet::new();
    walk(value, String::new(), &mut leaves);
    leaves
}

fn walk(value: &serde_json::Value, path: String, leaves: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(fields) => {
            for (name, member) in fields {
                let path = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
                walk(member, path, leaves);
            }
        }
        serde_json::Value::Array(elements) => {
            for element in elements {
                walk(element, format!("{path}[]"), leaves);
            }
        }
        _ => {
            leaves.insert(path);
        }
    }
}

/// Whether `leaf` is `path` or lies beneath it.
fn is_beneath(leaf: &str, path: &str) -> bool {
    leaf.strip_prefix(path)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with("[]"))
}

#[test]
fn what_nobody_decided_shows_tenants_nothing() {
    let payload = json!({ "at": "2026-12-01T12:00:00Z", "secret": "hunter2", "detail": "x" });
    // A field nobody listed is dropped, like a withheld one.
    assert_eq!(
        registry::tenant_view("lease", "LeaseActivated", &payload),
        json!({ "at": "2026-12-01T12:00:00Z" })
    );
    // An event type nobody registered, or a kind nobody registered, shows nothing at all.
    assert_eq!(registry::tenant_view("lease", "LeaseTeleported", &payload), json!({}));
    assert_eq!(registry::tenant_view("vm", "VmCreated", &payload), json!({}));
    assert_eq!(
        registry::tenant_view("lease", "LeaseActivated", &json!("not an object")),
        json!({})
    );
}

#[test]
fn a_member_nobody_listed_inside_a_shown_field_stays_hidden() {
    let payload = json!({
        "lease": "l-1",
        "at": "2026-12-01T12:00:00Z",
        "items": [
            { "sku": "gpu.h100.1x", "quantity": 1, "service_name": null, "custom_domain": null,
              "secret": "hunter2", "nested": { "token": "t" } }
        ],
        "provider": { "id": "p", "credentials": "x" },
        "items[].sku": "posing as a listed path",
        "items[]": ["posing as the array"]
    });
    let seen = registry::tenant_view("lease", "LeaseProvisionRequested", &payload);
    assert_eq!(
        seen,
        json!({
            "lease": "l-1",
            "at": "2026-12-01T12:00:00Z",
            "items": [
                { "sku": "gpu.h100.1x", "quantity": 1, "service_name": null, "custom_domain": null }
            ]
        }),
        "a member nobody listed, and an object where a scalar was listed, show nothing"
    );
}
