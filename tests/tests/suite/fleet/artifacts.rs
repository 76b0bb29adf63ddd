//! The artifact index over the projected snapshots: a digest finds the hosts holding a ready
//! artifact of the same tenant's, a layer key and arch the same tenant's newest ready layer;
//! another tenant's artifact with the same digest or layer key is a miss, never a hit.

use leasehold_adapters::PgReadModels;
use leasehold_domain::TenantId;
use leasehold_domain::snapshot::{
    Digest, LayerKey, ReportedSizes, SnapshotCommand, SnapshotId, SnapshotKind, SnapshotMode,
    Written,
};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{Arch, HostId};
use leasehold_domain::vm::SnapshotRef;
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_tests::TestDb;
use uuid::Uuid;

use super::snapshot_quota::{Pipeline, create_as, process, run_as, terms};
use crate::projections::support::{last_event, quick, start_of};

fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).expect("valid")
}

fn digest() -> Digest {
    Digest::parse("d", "ef".repeat(32)).expect("valid")
}

fn layer_key() -> LayerKey {
    LayerKey::parse("l", "step:apt-install").expect("valid")
}

/// A ready layer of `owner`'s, snapshot `n` on `host`.
async fn ready_layer(pipeline: &Pipeline, owner: &TenantId, n: u128, host: &str) {
    let mut layer = terms(n);
    layer.mode = SnapshotMode::Build;
    layer.layer_key = Some(layer_key());
    layer.host = HostId::parse("h", host).expect("valid");
    create_as(pipeline, owner, layer).await.expect("created");
    let written = Written {
        kind: SnapshotKind::Disk,
        sizes: ReportedSizes { disk_bytes: 500, memory_bytes: 0 },
        digest: Some(digest()),
        store_ref: SnapshotRef::parse("r", format!("snap-{n}")).expect("valid"),
        diff_of: None,
    };
    let confirm = SnapshotCommand::Confirm { operation: OperationId(Uuid::from_u128(n)), written };
    let snapshot = SnapshotId(Uuid::from_u128(n));
    run_as(pipeline, owner, snapshot, &format!("confirm-{n}"), confirm).await;
}

#[tokio::test]
async fn digest_and_layer_lookups_find_only_the_tenants_own_ready_artifacts() {
    let db = TestDb::migrated().await;
    let pipeline = process(&db);
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    ready_layer(&pipeline, &acme, 1, "agent-1").await;
    ready_layer(&pipeline, &acme, 2, "agent-2").await;
    ready_layer(&pipeline, &globex, 3, "agent-3").await;
    // One of acme's with the same layer key still being created: never served.
    let mut creating = terms(4);
    creating.mode = SnapshotMode::Build;
    creating.layer_key = Some(layer_key());
    create_as(&pipeline, &acme, creating).await.expect("created");

    let head = last_event(&db).await;
    let mut projector = start_of(SnapshotProjection, &db.store(), quick());
    projector.reached(head).await;
    projector.stop().await;

    let index = PgReadModels::of(&db.store());
    let hosts = |names: &[&str]| -> Vec<HostId> {
        names.iter().map(|name| HostId::parse("h", *name).expect("valid")).collect()
    };
    assert_eq!(
        index.artifact_holders(&acme, &digest()).await.expect("read"),
        hosts(&["agent-1", "agent-2"])
    );
    assert_eq!(
        index.artifact_holders(&globex, &digest()).await.expect("read"),
        hosts(&["agent-3"])
    );
    let initech = tenant("initech");
    assert!(index.artifact_holders(&initech, &digest()).await.expect("read").is_empty());

    let amd64 = Arch::amd64();
    // Snapshot 2 was created after 1 (each create a round trip later): the newest.
    let newest = index.newest_layer(&acme, &layer_key(), &amd64).await.expect("read");
    let newest = newest.expect("a hit");
    assert_eq!(newest.snapshot, SnapshotId(Uuid::from_u128(2)));
    assert_eq!(newest.host.as_str(), "agent-2");
    let theirs = index.newest_layer(&globex, &layer_key(), &amd64).await.expect("read");
    assert_eq!(theirs.map(|hit| hit.snapshot), Some(SnapshotId(Uuid::from_u128(3))));
    assert_eq!(index.newest_layer(&initech, &layer_key(), &amd64).await.expect("read"), None);
    let arm = Arch::parse("a", "arm64").expect("valid");
    assert_eq!(
        index.newest_layer(&acme, &layer_key(), &arm).await.expect("read"),
        None,
        "arch is part of the lookup"
    );
}

#[tokio::test]
async fn a_vms_last_live_snapshot_its_latest_and_a_snapshots_live_children_come_from_the_listing() {
    use leasehold_domain::snapshot::{DeleteCause, RequestedKind};
    use leasehold_domain::values::fleet::VmId;
    let db = TestDb::migrated().await;
    let pipeline = process(&db);
    let acme = tenant("acme");
    let vm = VmId(Uuid::from_u128(77));
    let snapshot = |n: u128| SnapshotId(Uuid::from_u128(n));
    // 1: live; 2: live, 1's child; 3: disk, 2's child, the newest.
    for (n, requested, kind, parent) in [
        (1, RequestedKind::Live, SnapshotKind::Live, None),
        (2, RequestedKind::Live, SnapshotKind::Live, Some(snapshot(1))),
        (3, RequestedKind::Disk, SnapshotKind::Disk, Some(snapshot(2))),
    ] {
        let mut asked = terms(n);
        asked.vm = vm;
        asked.requested = requested;
        asked.parent = parent;
        create_as(&pipeline, &acme, asked).await.expect("created");
        let written = Written {
            kind,
            sizes: ReportedSizes { disk_bytes: 100, memory_bytes: 50 },
            digest: None,
            store_ref: SnapshotRef::parse("r", format!("snap-{n}")).expect("valid"),
            diff_of: None,
        };
        let confirm =
            SnapshotCommand::Confirm { operation: OperationId(Uuid::from_u128(n)), written };
        run_as(&pipeline, &acme, snapshot(n), &format!("confirm-{n}"), confirm).await;
    }
    let project = || async {
        let head = last_event(&db).await;
        let mut projector = start_of(SnapshotProjection, &db.store(), quick());
        projector.reached(head).await;
        projector.stop().await;
    };
    project().await;
    let listing = PgReadModels::of(&db.store());
    assert_eq!(listing.last_live_snapshot(&acme, vm).await.expect("read"), Some(snapshot(2)));
    assert_eq!(listing.latest_snapshot_of(&acme, vm).await.expect("read"), Some(snapshot(3)));
    assert_eq!(listing.live_children(&acme, snapshot(1)).await.expect("read"), 1);
    let globex = tenant("globex");
    assert_eq!(listing.last_live_snapshot(&globex, vm).await.expect("read"), None);
    assert_eq!(listing.live_children(&globex, snapshot(1)).await.expect("read"), 0);
    // A child being deleted no longer holds its parent.
    let delete = SnapshotCommand::Delete {
        operation: OperationId(Uuid::from_u128(20)),
        cause: DeleteCause::Tenant,
    };
    run_as(&pipeline, &acme, snapshot(2), "delete-2", delete).await;
    project().await;
    assert_eq!(listing.live_children(&acme, snapshot(1)).await.expect("read"), 0);
    assert_eq!(listing.last_live_snapshot(&acme, vm).await.expect("read"), Some(snapshot(1)));
}

#[tokio::test]
async fn placements_artifact_lookup_finds_the_seeds_holders_of_the_tenants_own_only() {
    let db = TestDb::migrated().await;
    ready_layer(&process(&db), &tenant("globex"), 9, "agent-2").await;
    // The same bytes (its digest) pulled to agent-3 as another of globex's artifacts.
    ready_layer(&process(&db), &tenant("globex"), 10, "agent-3").await;
    let catalog = leasehold_adapters::PgHostCatalog::new(db.store());
    let head = last_event(&db).await;
    let mut projector = start_of(SnapshotProjection, &db.store(), quick());
    projector.reached(head).await;
    projector.stop().await;
    use leasehold_commands::vm_service::HostCatalog as _;
    let seed = SnapshotRef::parse("seed", "snap-9").expect("valid");
    let theirs = catalog.artifact_hosts(&tenant("globex"), &seed).await.expect("read");
    let names: Vec<&str> = theirs.iter().map(HostId::as_str).collect();
    assert_eq!(names, ["agent-2", "agent-3"], "the seed's host and its digest's other holders");
    assert!(catalog.artifact_hosts(&tenant("acme"), &seed).await.expect("read").is_empty());
    // By its snapshot id too (a tenant's way to name it), each host's copy under its own
    // store reference, with the digest a pull asks for.
    let by_id = SnapshotRef::parse("seed", Uuid::from_u128(9).to_string()).expect("valid");
    let copies = catalog.seed_copies(&tenant("globex"), &by_id).await.expect("read");
    let found: Vec<(&str, &str)> =
        copies.iter().map(|copy| (copy.host.as_str(), copy.store_ref.as_str())).collect();
    assert_eq!(found, [("agent-2", "snap-9"), ("agent-3", "snap-10")]);
    assert!(copies.iter().all(|copy| copy.digest == copies[0].digest && copy.digest.is_some()));
    assert!(catalog.seed_copies(&tenant("acme"), &by_id).await.expect("read").is_empty());
}
