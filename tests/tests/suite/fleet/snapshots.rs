//! Snapshots through their service, against PostgreSQL: taken of a tenant's running VM on the
//! building host's arch, confirmed by that host's agent with the honest size, fenced by the
//! current operation, deleted once and only without live children, and another tenant's
//! snapshot not found.

use leasehold_adapters::{PgEventStore, PgReadModels};
use leasehold_commands::snapshot_service::{
    AgentReport, CreateSnapshot, SnapshotConfig, SnapshotOutcome, SnapshotService,
};
use leasehold_commands::{CommandError, CommandPipeline, ErrorClass, PipelineConfig};
use leasehold_domain::EventStore as _;
use leasehold_domain::snapshot::{
    ReportedSizes, RequestedKind, SnapshotError, SnapshotId, SnapshotKind, SnapshotStatus, Written,
};
use leasehold_domain::values::fleet::{Arch, HostBackend, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail};
use leasehold_domain::vm::{SnapshotRef, VmUrl};
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_tests::TestDb;

use super::support::{
    agent, host_id, host_spec, no_secrets, register, service, spec, task, tenant,
};
use crate::projections::support::{last_event, quick, start_of};

type Snapshots = SnapshotService<PgEventStore, PgReadModels>;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn snapshots(db: &TestDb) -> Snapshots {
    let pipeline = CommandPipeline::new(db.store(), PipelineConfig::default());
    SnapshotService::new(pipeline, PgReadModels::of(&db.store()), SnapshotConfig::default())
}

/// A running VM of acme's on agent-1 (an arm64 host), booted by its agent.
async fn running_vm(db: &TestDb) -> VmId {
    let mut arm = host_spec(HostBackend::Firecracker, 16, 4);
    arm.capacity.arch = Arch::parse("arch", "arm64").expect("valid");
    register(db, "agent-1", arm).await;
    let vms = service(db, &["agent-1"], leasehold_domain::vm::PlacementPolicy::Spread);
    let created = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
    let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    vms.report_booted(&agent(), &host_id("agent-1"), "b-1", created.vm, (boot, url))
        .await
        .expect("booted");
    created.vm
}

fn ask(vm: VmId, requested: RequestedKind) -> CreateSnapshot {
    super::support::snapshot_ask(vm, requested)
}

fn written(kind: SnapshotKind, memory_bytes: u64) -> Written {
    Written {
        kind,
        sizes: ReportedSizes { disk_bytes: 3 * GIB, memory_bytes },
        digest: None,
        store_ref: SnapshotRef::parse("ref", "snap-a").expect("valid"),
        diff_of: None,
    }
}

/// The agent of agent-1 confirms `snapshot` as `written`.
async fn confirm(
    snapshots: &Snapshots,
    snapshot: SnapshotId,
    written: Written,
) -> Result<SnapshotOutcome, CommandError<SnapshotError>> {
    let (_, stored) = snapshots.owned(snapshot).await.expect("stored");
    let operation = stored.operation.expect("a creation");
    let report = AgentReport::Written { operation, written };
    let key = format!("confirm-{}", snapshot.0);
    snapshots.report(&agent(), (&host_id("agent-1"), &key), snapshot, report).await
}

/// acme's live snapshot "s-1" of `vm`, written by its agent and projected (the VM's last live
/// snapshot, as the listing shows it).
async fn ready_live(db: &TestDb, snapshots: &Snapshots, vm: VmId) -> SnapshotId {
    let (acme, asked) = (tenant("acme"), ask(vm, RequestedKind::Live));
    let live = snapshots.create(&acme, "s-1", &asked).await.expect("ok").snapshot;
    confirm(snapshots, live, written(SnapshotKind::Live, GIB)).await.expect("ok");
    project(db).await;
    live
}

async fn project(db: &TestDb) {
    let head = last_event(db).await;
    let mut projector = start_of(SnapshotProjection, &db.store(), quick());
    projector.reached(head).await;
    projector.stop().await;
}

#[tokio::test]
async fn a_live_snapshot_is_filed_on_the_building_hosts_arch_and_settled_to_its_honest_size() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let created =
        snapshots.create(&tenant("acme"), "s-1", &ask(vm, RequestedKind::Live)).await.expect("ok");
    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Creating);
    let terms = stored.terms.expect("terms");
    assert_eq!(terms.arch.as_str(), "arm64", "the host's arch, never the caller's");
    assert_eq!(terms.estimate_bytes, 10 * GIB + 2_048 * MIB, "disk and memory");
    let acme = tenant("acme").tenant.expect("a tenant");
    let quota = snapshots.quota(&acme).await.expect("readable").expect("opened");
    assert_eq!((quota.usage.count, quota.usage.bytes), (1, 10 * GIB + 2_048 * MIB));

    confirm(&snapshots, created.snapshot, written(SnapshotKind::Live, 2 * GIB)).await.expect("ok");
    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Ready);
    assert_eq!(stored.size_bytes, 5 * GIB, "the memory counts");
    let quota = snapshots.quota(&acme).await.expect("readable").expect("opened");
    assert_eq!(quota.usage.bytes, 5 * GIB, "settled to the honest size");

    let retry = snapshots.create(&tenant("acme"), "s-1", &ask(vm, RequestedKind::Live)).await;
    let retry = retry.expect("a retry answers the first outcome");
    assert!(retry.outcome.duplicate);
    assert_eq!(retry.snapshot, created.snapshot);
}

#[tokio::test]
async fn a_live_request_served_as_disk_is_filed_as_disk_and_counts_no_memory() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let created =
        snapshots.create(&tenant("acme"), "s-1", &ask(vm, RequestedKind::Live)).await.expect("ok");
    confirm(&snapshots, created.snapshot, written(SnapshotKind::Disk, 2 * GIB)).await.expect("ok");
    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    assert_eq!(stored.written.expect("written").kind, SnapshotKind::Disk);
    assert_eq!(stored.size_bytes, 3 * GIB);
}

#[tokio::test]
async fn a_diff_without_a_live_parent_is_refused_with_the_reason() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let refused = snapshots.create(&tenant("acme"), "d-1", &ask(vm, RequestedKind::Diff)).await;
    let Err(error) = refused else { panic!("a diff with no live parent was accepted") };
    assert!(
        matches!(
            error,
            CommandError::Refused(SnapshotError::DiffNeedsLiveParent { last_live: None })
        ),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::InvalidState);
    assert!(error.to_string().contains("last live snapshot"), "{error}");

    // A disk snapshot is no live parent either; a live one, once the listing shows it, is.
    let disk = snapshots.create(&tenant("acme"), "s-1", &ask(vm, RequestedKind::Disk)).await;
    confirm(&snapshots, disk.expect("ok").snapshot, written(SnapshotKind::Disk, 0))
        .await
        .expect("ok");
    project(&db).await;
    let refused = snapshots.create(&tenant("acme"), "d-2", &ask(vm, RequestedKind::Diff)).await;
    assert!(matches!(
        refused,
        Err(CommandError::Refused(SnapshotError::DiffNeedsLiveParent { .. }))
    ));
    let live = snapshots.create(&tenant("acme"), "s-2", &ask(vm, RequestedKind::Live)).await;
    let live = live.expect("ok").snapshot;
    confirm(&snapshots, live, written(SnapshotKind::Live, GIB)).await.expect("ok");
    project(&db).await;
    let diff = snapshots.create(&tenant("acme"), "d-3", &ask(vm, RequestedKind::Diff)).await;
    let diff = diff.expect("a diff over the VM's last live snapshot");
    let (_, stored) = snapshots.owned(diff.snapshot).await.expect("stored");
    assert_eq!(stored.terms.expect("terms").parent, Some(live));
}

#[tokio::test]
async fn a_parent_with_a_live_child_is_kept_and_a_second_delete_records_nothing() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let acme = tenant("acme");
    let live = ready_live(&db, &snapshots, vm).await;
    let diff = snapshots.create(&acme, "d-1", &ask(vm, RequestedKind::Diff)).await.expect("ok");
    let as_diff = Written { diff_of: Some(live), ..written(SnapshotKind::Live, GIB) };
    confirm(&snapshots, diff.snapshot, as_diff).await.expect("ok");
    project(&db).await;

    let refused = snapshots.delete(&acme, "del-parent", live).await;
    let Err(error) = refused else { panic!("a parent with a live child was deleted") };
    assert!(matches!(error, CommandError::Refused(SnapshotError::HasLiveChildren { count: 1 })));
    assert_eq!(error.class(), ErrorClass::InvalidState);

    let first = snapshots.delete(&acme, "del-1", diff.snapshot).await.expect("deleting");
    let second = snapshots.delete(&acme, "del-2", diff.snapshot).await.expect("idempotent");
    assert!(!second.outcome.duplicate && second.outcome.event_types.is_empty());
    assert_eq!(second.outcome.version, first.outcome.version);
    let events =
        db.store().read_stream(&diff.snapshot.stream_id(), 1, 100).await.expect("readable");
    let deleting = events.iter().filter(|e| e.event_type.as_str() == "SnapshotDeleting").count();
    assert_eq!(deleting, 1, "one deletion event");
}

#[tokio::test]
async fn a_provider_not_found_still_deletes_and_releases_the_quota() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let acme = tenant("acme");
    let created = snapshots.create(&acme, "s-1", &ask(vm, RequestedKind::Disk)).await.expect("ok");
    confirm(&snapshots, created.snapshot, written(SnapshotKind::Disk, 0)).await.expect("ok");
    snapshots.delete(&acme, "del-1", created.snapshot).await.expect("deleting");
    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    let operation = stored.operation.expect("a deletion");
    let report = AgentReport::Deleted { operation, not_found: true };
    snapshots
        .report(&agent(), (&host_id("agent-1"), "gone-1"), created.snapshot, report)
        .await
        .expect("a not-found is a deletion");
    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Deleted);
    let owner = acme.tenant.expect("a tenant");
    let quota = snapshots.quota(&owner).await.expect("readable").expect("opened");
    assert_eq!((quota.usage.count, quota.usage.bytes), (0, 0));
}

#[tokio::test]
async fn reports_are_fenced_by_the_current_operation_and_scoped_to_the_agents_host() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let created =
        snapshots.create(&tenant("acme"), "s-1", &ask(vm, RequestedKind::Disk)).await.expect("ok");
    let stale = OperationId(uuid::Uuid::from_u128(7));
    let report = AgentReport::Written { operation: stale, written: written(SnapshotKind::Disk, 0) };
    let fenced =
        snapshots.report(&agent(), (&host_id("agent-1"), "w-1"), created.snapshot, report).await;
    let Err(error) = fenced else { panic!("a stale operation's report was taken") };
    assert_eq!(error.class(), ErrorClass::Fenced);

    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    let operation = stored.operation.expect("a creation");
    let report = AgentReport::WriteFailed { operation, detail: OperatorDetail::new("full") };
    let elsewhere =
        snapshots.report(&agent(), (&host_id("agent-2"), "w-2"), created.snapshot, report).await;
    assert!(matches!(elsewhere, Err(CommandError::NotFound)), "{elsewhere:?}");
}

#[tokio::test]
async fn another_tenants_snapshot_and_vm_are_not_found() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let created =
        snapshots.create(&tenant("acme"), "s-1", &ask(vm, RequestedKind::Disk)).await.expect("ok");
    confirm(&snapshots, created.snapshot, written(SnapshotKind::Disk, 0)).await.expect("ok");
    let globex = tenant("globex");
    let on_their_vm = snapshots.create(&globex, "s-1", &ask(vm, RequestedKind::Disk)).await;
    assert!(matches!(on_their_vm, Err(CommandError::NotFound)), "{on_their_vm:?}");
    let deleted = snapshots.delete(&globex, "del-1", created.snapshot).await;
    assert!(matches!(deleted, Err(CommandError::NotFound)), "{deleted:?}");
    let restored = snapshots.restore(&globex, "r-1", (created.snapshot, vm)).await;
    assert!(matches!(restored, Err(CommandError::NotFound)), "{restored:?}");
    let (_, stored) = snapshots.owned(created.snapshot).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Ready, "untouched");
}

#[tokio::test]
async fn a_diffs_parent_is_kept_before_the_listing_shows_the_diff() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let acme = tenant("acme");
    let live = ready_live(&db, &snapshots, vm).await;
    let diff = snapshots.create(&acme, "d-1", &ask(vm, RequestedKind::Diff)).await.expect("ok");
    // Not projected yet: the listing still shows no child; the parent's own state does.
    let refused = snapshots.delete(&acme, "del-parent", live).await;
    assert!(
        matches!(refused, Err(CommandError::Refused(SnapshotError::HasLiveChildren { count: 1 }))),
        "{refused:?}"
    );
    // Once the diff is being deleted, its parent lets it go in the same append.
    let as_diff = Written { diff_of: Some(live), ..written(SnapshotKind::Live, GIB) };
    confirm(&snapshots, diff.snapshot, as_diff).await.expect("ok");
    snapshots.delete(&acme, "del-diff", diff.snapshot).await.expect("deleting");
    let (_, parent) = snapshots.owned(live).await.expect("stored");
    assert_eq!(parent.children.len(), 1, "a deletion that may still fail keeps the parent");
    let (_, deleting) = snapshots.owned(diff.snapshot).await.expect("stored");
    let operation = deleting.operation.expect("a deletion");
    let gone = AgentReport::Deleted { operation, not_found: false };
    let host = host_id("agent-1");
    snapshots.report(&agent(), (&host, "gone-diff"), diff.snapshot, gone).await.expect("ok");
    let (_, parent) = snapshots.owned(live).await.expect("stored");
    assert!(parent.children.is_empty(), "released with the diff's confirmed deletion");
    project(&db).await;
    snapshots.delete(&acme, "del-parent-2", live).await.expect("no live child left");
}

#[tokio::test]
async fn a_diff_over_a_parent_being_deleted_is_refused_whatever_the_listing_says() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let acme = tenant("acme");
    let live = ready_live(&db, &snapshots, vm).await;
    snapshots.delete(&acme, "del-1", live).await.expect("deleting");
    // The listing still shows the parent ready and the VM's last live snapshot.
    let refused = snapshots.create(&acme, "d-1", &ask(vm, RequestedKind::Diff)).await;
    let Err(error) = refused else { panic!("a diff over a parent being deleted was accepted") };
    assert!(
        matches!(
            &error,
            CommandError::LinkedRefused { kind: leasehold_domain::RefusalKind::InvalidState, .. }
        ),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::InvalidState);
    let acme_id = acme.tenant.expect("a tenant");
    let quota = snapshots.quota(&acme_id).await.expect("readable").expect("opened");
    assert_eq!(quota.usage.count, 0, "nothing of the refused diff was reserved");
}

#[tokio::test]
async fn eight_concurrent_creates_through_eight_services_with_room_for_five_commit_five() {
    use leasehold_domain::quota::QuotaLimits;
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let acme = tenant("acme");
    let owner = acme.tenant.clone().expect("a tenant");
    let operator = leasehold_commands::lease_service::Caller { tenant: None, ..acme.clone() };
    let limits = QuotaLimits { max_count: 5, max_bytes: 0 };
    snapshots(&db).set_limits(&operator, "q-1", (&owner, limits)).await.expect("limits set");
    // Eight processes: eight pipelines, eight sets of lanes, nothing remembered in common.
    let processes: Vec<Snapshots> = (0..8)
        .map(|_| {
            let config = PipelineConfig { retries_max: 32, ..PipelineConfig::default() };
            let pipeline = CommandPipeline::new(db.store(), config);
            SnapshotService::new(pipeline, PgReadModels::of(&db.store()), SnapshotConfig::default())
        })
        .collect();
    let creates = processes.iter().enumerate().map(|(n, process)| {
        let (acme, key) = (acme.clone(), format!("s-{n}"));
        async move { process.create(&acme, &key, &ask(vm, RequestedKind::Disk)).await }
    });
    let outcomes = futures_util::future::join_all(creates).await;
    let accepted = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    assert_eq!(accepted, 5, "{outcomes:?}");
    for refused in outcomes.iter().filter_map(|outcome| outcome.as_ref().err()) {
        assert_eq!(refused.class(), ErrorClass::QuotaExceeded, "{refused:?}");
    }
    let quota = snapshots(&db).quota(&owner).await.expect("readable").expect("opened");
    assert_eq!(quota.usage.count, 5);
}

#[tokio::test]
async fn a_diff_never_written_releases_its_parent() {
    let db = TestDb::migrated().await;
    let vm = running_vm(&db).await;
    let snapshots = snapshots(&db);
    let acme = tenant("acme");
    let live = ready_live(&db, &snapshots, vm).await;
    let diff = snapshots.create(&acme, "d-1", &ask(vm, RequestedKind::Diff)).await.expect("ok");
    let (_, stored) = snapshots.owned(diff.snapshot).await.expect("stored");
    let operation = stored.operation.expect("a creation");
    let failed = AgentReport::WriteFailed { operation, detail: OperatorDetail::new("full") };
    let host = host_id("agent-1");
    snapshots.report(&agent(), (&host, "w-fail"), diff.snapshot, failed).await.expect("ok");
    let (_, parent) = snapshots.owned(live).await.expect("stored");
    assert!(parent.children.is_empty(), "a failed diff depends on nothing");
}

#[tokio::test]
async fn an_agents_failure_text_is_recorded_without_the_vms_credentials() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], leasehold_domain::vm::PlacementPolicy::Spread);
    let secrets = [("API_KEY".to_owned(), "s3cr3t-snap-7f2".to_owned())].into();
    let created =
        vms.create(&tenant("acme"), "c-1", (&task("t"), spec()), &secrets).await.expect("placed");
    let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
    let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    let host = host_id("agent-1");
    vms.report_booted(&agent(), &host, "b-1", created.vm, (boot, url)).await.expect("booted");
    let snapshots = snapshots(&db).with_redactor(std::sync::Arc::new(vms.clone()));
    let taken = snapshots
        .create(&tenant("acme"), "s-1", &ask(created.vm, RequestedKind::Disk))
        .await
        .expect("ok");
    let (_, stored) = snapshots.owned(taken.snapshot).await.expect("stored");
    let operation = stored.operation.expect("a creation");
    let detail = OperatorDetail::new("snapshot failed: env API_KEY=s3cr3t-snap-7f2 rejected");
    let failed = AgentReport::WriteFailed { operation, detail };
    snapshots.report(&agent(), (&host, "w-1"), taken.snapshot, failed).await.expect("ok");
    let (_, stored) = snapshots.owned(taken.snapshot).await.expect("stored");
    let recorded = stored.last_error.expect("recorded").as_str().to_owned();
    assert!(!recorded.contains("s3cr3t-snap-7f2"), "{recorded}");
    assert!(recorded.contains("[redacted]"), "{recorded}");
    let events = db.store().read_stream(&taken.snapshot.stream_id(), 1, 10).await.expect("read");
    assert!(events.iter().all(|event| !event.payload.to_string().contains("s3cr3t-snap-7f2")));
}
