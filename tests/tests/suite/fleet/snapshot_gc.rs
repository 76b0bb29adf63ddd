//! Retention GC over a generated fleet of snapshots, on a controlled clock, against
//! PostgreSQL: swept until it deletes nothing more, it deleted exactly the snapshots past
//! their retention that are no build artifact, no VM's latest and no ancestor of one kept,
//! and the log shows no parent's deletion before all its children's. A failed GC deletion is
//! tried again on the next sweep, and repeated failures become a dead letter.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_adapters::snapshot_gc::SnapshotGc;
use leasehold_adapters::{PgEventStore, PgReadModels};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::snapshot_service::{
    AgentReport, CreateSnapshot, SnapshotConfig, SnapshotService,
};
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::Clock;
use leasehold_domain::snapshot::{
    LayerKey, ReportedSizes, RequestedKind, SnapshotId, SnapshotKind, SnapshotMode, SnapshotStatus,
    Written,
};
use leasehold_domain::values::OperatorDetail;
use leasehold_domain::values::fleet::{HostBackend, VmId};
use leasehold_domain::vm::{PlacementPolicy, SnapshotRef, VmUrl};
use leasehold_projections::ManualClock;
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_tests::TestDb;

use super::support::{
    agent, host_id, host_spec, no_secrets, register, service, spec, task, tenant,
};
use crate::projections::support::{last_event, quick, start_of};

type Snapshots = SnapshotService<PgEventStore, PgReadModels>;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time")
}

fn snapshots(db: &TestDb, clock: &Arc<ManualClock>) -> Snapshots {
    let pipeline = CommandPipeline::new(db.store(), PipelineConfig::default())
        .with_clock(Arc::clone(clock) as Arc<dyn Clock>);
    SnapshotService::new(pipeline, PgReadModels::of(&db.store()), SnapshotConfig::default())
}

/// A manual disk snapshot of `vm`, kept until `retention_until`.
fn disk_of(vm: VmId, retention_until: Option<DateTime<Utc>>) -> CreateSnapshot {
    CreateSnapshot {
        vm,
        requested: RequestedKind::Disk,
        mode: SnapshotMode::Manual,
        parent: None,
        layer_key: None,
        name: None,
        retention_until,
    }
}

/// `count` running VMs of acme's on agent-1.
async fn running_vms(db: &TestDb, count: usize) -> Vec<VmId> {
    register(db, "agent-1", host_spec(HostBackend::Firecracker, 64, 16)).await;
    let vms = service(db, &["agent-1"], PlacementPolicy::Spread);
    let mut running = Vec::new();
    for n in 0..count {
        let key = format!("c-{n}");
        let created = vms
            .create(&tenant("acme"), &key, (&task(&format!("t-{n}")), spec()), &no_secrets())
            .await
            .expect("placed");
        let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
        let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
        vms.report_booted(
            &agent(),
            &host_id("agent-1"),
            &format!("b-{n}"),
            created.vm,
            (boot, url),
        )
        .await
        .expect("booted");
        running.push(created.vm);
    }
    running
}

async fn project(db: &TestDb) {
    let head = last_event(db).await;
    let mut projector = start_of(SnapshotProjection, &db.store(), quick());
    projector.reached(head).await;
    projector.stop().await;
}

/// A small deterministic generator (the seed names a fleet; a failure names its seed).
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % sides
    }
}

/// What the test generated of one snapshot.
#[derive(Debug, Clone)]
struct Made {
    vm: VmId,
    mode: SnapshotMode,
    parent: Option<SnapshotId>,
    retained: bool,
    ready: bool,
}

/// The agent of agent-1 reports `snapshot` written: live, a diff over `diff_of`, or disk.
async fn write(
    snapshots: &Snapshots,
    snapshot: SnapshotId,
    kind: SnapshotKind,
    diff_of: Option<SnapshotId>,
) {
    let (_, stored) = snapshots.owned(snapshot).await.expect("stored");
    let operation = stored.operation.expect("a creation");
    let written = Written {
        kind,
        sizes: ReportedSizes { disk_bytes: 1_000, memory_bytes: 500 },
        digest: None,
        store_ref: SnapshotRef::parse("ref", format!("s-{}", snapshot.0)).expect("valid"),
        diff_of,
    };
    let key = format!("w-{}", snapshot.0);
    let report = AgentReport::Written { operation, written };
    snapshots
        .report(&agent(), (&host_id("agent-1"), &key), snapshot, report)
        .await
        .expect("written");
}

/// A disk snapshot `ask`ed by `caller` under `key`, written by its agent.
async fn ready_disk(
    snapshots: &Snapshots,
    (caller, key): (&Caller, &str),
    ask: &CreateSnapshot,
) -> SnapshotId {
    let created = snapshots.create(caller, key, ask).await.expect("created").snapshot;
    write(snapshots, created, SnapshotKind::Disk, None).await;
    created
}

/// Generates seed `seed`'s fleet of snapshots over `vms`, in creation order (a second
/// apart, so that "newest" is never a tie): manual, auto and build, disk, live and diffs over
/// the VM's last live one, most with a retention of an hour, a few without, a few never
/// confirmed.
async fn generate(
    db: &TestDb,
    (snapshots, clock): (&Snapshots, &ManualClock),
    vms: &[VmId],
    seed: u64,
) -> Vec<(SnapshotId, Made)> {
    let mut dice = Dice(seed);
    let mut made = Vec::new();
    let mut last_live: BTreeMap<VmId, SnapshotId> = BTreeMap::new();
    let acme = tenant("acme");
    for n in 0..24 {
        let vm = vms[usize::try_from(dice.roll(vms.len() as u64)).expect("small")];
        let (requested, mode) = match dice.roll(10) {
            0..=2 => (RequestedKind::Disk, SnapshotMode::Manual),
            3..=4 => (RequestedKind::Live, SnapshotMode::Manual),
            5..=6 if last_live.contains_key(&vm) => (RequestedKind::Diff, SnapshotMode::Auto),
            5..=6 => (RequestedKind::Live, SnapshotMode::Auto),
            7 => (RequestedKind::Disk, SnapshotMode::Build),
            _ => (RequestedKind::Disk, SnapshotMode::Auto),
        };
        let retained = dice.roll(5) != 0;
        let ask = CreateSnapshot {
            vm,
            requested,
            mode,
            parent: None,
            layer_key: (mode == SnapshotMode::Build)
                .then(|| LayerKey::parse("l", format!("step-{n}")).expect("valid")),
            name: None,
            retention_until: retained.then(|| clock.now() + TimeDelta::hours(1)),
        };
        let created = snapshots.create(&acme, &format!("s-{n}"), &ask).await.expect("created");
        let parent = (requested == RequestedKind::Diff).then(|| last_live[&vm]);
        let ready = dice.roll(8) != 0;
        if ready {
            let kind = if requested == RequestedKind::Disk {
                SnapshotKind::Disk
            } else {
                SnapshotKind::Live
            };
            write(snapshots, created.snapshot, kind, parent).await;
            if kind == SnapshotKind::Live {
                last_live.insert(vm, created.snapshot);
            }
        }
        made.push((created.snapshot, Made { vm, mode, parent, retained, ready }));
        project(db).await;
        clock.advance(TimeDelta::seconds(1));
    }
    made
}

/// What must be kept: build artifacts, those without retention or never ready, each VM's
/// newest, and every ancestor of something kept (a parent with a live child).
fn expected_kept(made: &[(SnapshotId, Made)]) -> BTreeSet<SnapshotId> {
    let mut kept: BTreeSet<SnapshotId> = made
        .iter()
        .filter(|(_, m)| m.mode == SnapshotMode::Build || !m.retained || !m.ready)
        .map(|(id, _)| *id)
        .collect();
    let vms: BTreeSet<VmId> = made.iter().map(|(_, m)| m.vm).collect();
    for vm in vms {
        let newest = made.iter().rev().find(|(_, m)| m.vm == vm).expect("one of its own");
        kept.insert(newest.0);
    }
    let parents: BTreeMap<SnapshotId, SnapshotId> =
        made.iter().filter_map(|(id, m)| m.parent.map(|parent| (*id, parent))).collect();
    loop {
        let more: Vec<SnapshotId> = kept
            .iter()
            .filter_map(|id| parents.get(id))
            .filter(|p| !kept.contains(p))
            .copied()
            .collect();
        if more.is_empty() {
            return kept;
        }
        kept.extend(more);
    }
}

/// The agent of agent-1 confirms every deletion in flight.
async fn confirm_deletions(snapshots: &Snapshots, made: &[(SnapshotId, Made)]) {
    for (id, _) in made {
        let (_, stored) = snapshots.owned(*id).await.expect("stored");
        if stored.status != SnapshotStatus::Deleting {
            continue;
        }
        let operation = stored.operation.expect("a deletion");
        let report = AgentReport::Deleted { operation, not_found: false };
        let key = format!("gone-{}", id.0);
        snapshots
            .report(&agent(), (&host_id("agent-1"), &key), *id, report)
            .await
            .expect("deleted");
    }
}

/// Every snapshot stream's SnapshotDeleting, in commit order.
async fn deletions_in_order(db: &TestDb) -> Vec<SnapshotId> {
    let rows = db
        .client()
        .await
        .query(
            "SELECT stream_id FROM events WHERE event_type = 'SnapshotDeleting' \
             ORDER BY log_epoch, tx_id, position",
            &[],
        )
        .await
        .expect("readable");
    rows.iter()
        .filter_map(|row| {
            let stream = leasehold_domain::StreamId::parse(row.get::<_, String>(0)).ok()?;
            SnapshotId::of_stream(&stream)
        })
        .collect()
}

/// Runs GC over seed `seed`'s fleet and checks it; answers how many parents it deleted.
async fn gc_over_a_generated_fleet(seed: u64) -> usize {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 3).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let made = generate(&db, (&snapshots, &clock), &vms, seed).await;
    clock.advance(TimeDelta::hours(2));
    let gc = SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1));
    // Swept until a sweep asks for no deletion: chains are deleted from their leaves, one
    // generation a sweep.
    for sweep in 0.. {
        assert!(sweep < 30, "seed {seed}: GC never settled");
        let swept = gc.sweep(clock.now()).await.expect("swept");
        assert_eq!(swept.failed, 0, "seed {seed}: {swept:?}");
        confirm_deletions(&snapshots, &made).await;
        project(&db).await;
        if swept.deleting == 0 {
            break;
        }
    }
    let kept = expected_kept(&made);
    for (id, m) in &made {
        let (_, stored) = snapshots.owned(*id).await.expect("stored");
        let deleted = stored.status == SnapshotStatus::Deleted;
        assert_eq!(!deleted, kept.contains(id), "seed {seed}: {id:?} {m:?} is {:?}", stored.status);
    }
    assert!(kept.len() < made.len(), "seed {seed}: the fleet had nothing to collect");
    // No parent's deletion before every one of its children's.
    let order = deletions_in_order(&db).await;
    let at: BTreeMap<SnapshotId, usize> =
        order.iter().enumerate().map(|(n, id)| (*id, n)).collect();
    for (child, m) in &made {
        if let Some(parent) = m.parent.and_then(|parent| at.get(&parent)) {
            let child_at = at
                .get(child)
                .unwrap_or_else(|| panic!("seed {seed}: a parent went before its live child"));
            assert!(child_at < parent, "seed {seed}: a parent was deleted before its child");
        }
    }
    made.iter().filter_map(|(_, m)| m.parent).filter(|parent| at.contains_key(parent)).count()
}

#[tokio::test]
async fn gc_deletes_exactly_what_is_past_retention_and_unprotected_over_generated_fleets() {
    let mut parents_deleted = 0;
    for seed in [1, 7, 42] {
        parents_deleted += gc_over_a_generated_fleet(seed).await;
    }
    assert!(parents_deleted > 0, "the fleets never had a parent to collect after its children");
}

#[tokio::test]
async fn a_failed_gc_deletion_is_tried_again_and_the_fifth_in_a_row_is_a_dead_letter() {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 1).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let acme = tenant("acme");
    let mut ids = Vec::new();
    for n in 0..2 {
        let ask = disk_of(vms[0], Some(clock.now() + TimeDelta::hours(1)));
        let created = snapshots.create(&acme, &format!("s-{n}"), &ask).await.expect("created");
        write(&snapshots, created.snapshot, SnapshotKind::Disk, None).await;
        ids.push(created.snapshot);
        clock.advance(TimeDelta::seconds(1));
    }
    clock.advance(TimeDelta::hours(2));
    project(&db).await;
    let gc = SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1));
    let old = ids[0];
    for failure in 1..=5u32 {
        let swept = gc.sweep(clock.now()).await.expect("swept");
        assert_eq!(swept.deleting, 1, "only the older one; the VM's latest is kept: {swept:?}");
        let (_, stored) = snapshots.owned(old).await.expect("stored");
        let operation = stored.operation.expect("a deletion");
        let report = AgentReport::DeleteFailed { operation, detail: OperatorDetail::new("busy") };
        let key = format!("fail-{failure}");
        snapshots
            .report(&agent(), (&host_id("agent-1"), &key), old, report)
            .await
            .expect("recorded");
        let (_, stored) = snapshots.owned(old).await.expect("stored");
        assert_eq!((stored.status, stored.gc_failures), (SnapshotStatus::Error, failure));
        project(&db).await;
        clock.advance(TimeDelta::hours(1));
    }
    let letters = PgReadModels::of(&db.store()).dead_letters().await.expect("readable");
    let letter = letters.iter().find(|l| l.kind == "snapshot_gc").expect("a dead letter");
    assert_eq!(letter.entity_id, old.stream_id().as_str());
    let (_, latest) = snapshots.owned(ids[1]).await.expect("stored");
    assert_eq!(latest.status, SnapshotStatus::Ready, "the VM's latest is never collected");
}

#[tokio::test]
async fn past_a_tenants_layer_cap_the_least_recently_used_layers_are_evicted_as_events() {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 1).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let acme = tenant("acme");
    let mut layers = Vec::new();
    for n in 0..4 {
        let ask = CreateSnapshot {
            mode: SnapshotMode::Build,
            layer_key: Some(LayerKey::parse("l", format!("step-{n}")).expect("valid")),
            ..disk_of(vms[0], None)
        };
        let created = snapshots.create(&acme, &format!("l-{n}"), &ask).await.expect("created");
        write(&snapshots, created.snapshot, SnapshotKind::Disk, None).await;
        layers.push(created.snapshot);
        clock.advance(TimeDelta::minutes(1));
    }
    // A cache hit on the oldest makes it the most recently used.
    let owner = acme.tenant.clone().expect("a tenant");
    snapshots.use_layer(&agent(), "hit-0", (&owner, layers[0])).await.expect("used");
    project(&db).await;
    let gc =
        SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1)).with_layer_cap(Some(2));
    let swept = gc.sweep(clock.now()).await.expect("swept");
    assert_eq!((swept.evicting, swept.deleting), (2, 0), "{swept:?}");
    let mut states = Vec::new();
    for layer in &layers {
        let (_, stored) = snapshots.owned(*layer).await.expect("stored");
        states.push((stored.status, stored.deletion));
    }
    use leasehold_domain::snapshot::DeleteCause;
    assert_eq!(
        states,
        [
            (SnapshotStatus::Ready, None),
            (SnapshotStatus::Deleting, Some(DeleteCause::Evicted)),
            (SnapshotStatus::Deleting, Some(DeleteCause::Evicted)),
            (SnapshotStatus::Ready, None),
        ],
        "the used one and the newest are kept"
    );
    // Under the cap now (the projection has the evictions): nothing more is evicted.
    project(&db).await;
    clock.advance(TimeDelta::hours(1));
    assert_eq!(gc.sweep(clock.now()).await.expect("swept").evicting, 0);
}

#[tokio::test]
async fn a_layer_over_the_cap_that_is_a_live_childs_parent_is_never_asked_to_be_evicted() {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 1).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let acme = tenant("acme");
    let layer = |n: u32, requested| CreateSnapshot {
        requested,
        mode: SnapshotMode::Build,
        layer_key: Some(LayerKey::parse("l", format!("step-{n}")).expect("valid")),
        ..disk_of(vms[0], None)
    };
    // The least recently used layer is live, and a diff over it is alive.
    let parent = snapshots.create(&acme, "l-0", &layer(0, RequestedKind::Live)).await;
    let parent = parent.expect("created").snapshot;
    write(&snapshots, parent, SnapshotKind::Live, None).await;
    project(&db).await;
    clock.advance(TimeDelta::minutes(1));
    let diff = CreateSnapshot { requested: RequestedKind::Diff, ..disk_of(vms[0], None) };
    let child = snapshots.create(&acme, "d-0", &diff).await.expect("created").snapshot;
    write(&snapshots, child, SnapshotKind::Live, Some(parent)).await;
    let mut newer = Vec::new();
    for n in 1..3 {
        clock.advance(TimeDelta::minutes(1));
        let (key, ask) = (format!("l-{n}"), layer(n, RequestedKind::Disk));
        let created = snapshots.create(&acme, &key, &ask).await.expect("created").snapshot;
        write(&snapshots, created, SnapshotKind::Disk, None).await;
        newer.push(created);
    }
    project(&db).await;
    let gc =
        SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1)).with_layer_cap(Some(1));
    let swept = gc.sweep(clock.now()).await.expect("swept");
    // Two are past the cap: the parent (kept by its child, so never asked) and the older of
    // the disk layers, evicted.
    assert_eq!((swept.evicting, swept.kept, swept.failed), (1, 0, 0), "{swept:?}");
    let (_, stored) = snapshots.owned(parent).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Ready);
    let (_, stored) = snapshots.owned(newer[0]).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Deleting);
}

#[tokio::test]
async fn a_newer_snapshot_still_being_created_leaves_the_vms_latest_ready_one_kept() {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 1).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let acme = tenant("acme");
    let ask = disk_of(vms[0], Some(clock.now() + TimeDelta::hours(1)));
    let ready = ready_disk(&snapshots, (&acme, "s-0"), &ask).await;
    clock.advance(TimeDelta::seconds(1));
    // The newest is still being written (and might never be): the ready one stays the latest.
    snapshots.create(&acme, "s-1", &ask).await.expect("created");
    clock.advance(TimeDelta::hours(2));
    project(&db).await;
    let gc = SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1));
    let swept = gc.sweep(clock.now()).await.expect("swept");
    assert_eq!(swept.deleting, 0, "{swept:?}");
    let (_, stored) = snapshots.owned(ready).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Ready);
}

#[tokio::test]
async fn gc_keeps_the_older_snapshot_when_the_latest_it_read_was_deleted_in_the_log_meanwhile() {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 1).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let acme = tenant("acme");
    let ask = disk_of(vms[0], Some(clock.now() + TimeDelta::hours(1)));
    let older = ready_disk(&snapshots, (&acme, "s-0"), &ask).await;
    clock.advance(TimeDelta::seconds(1));
    let latest = ready_disk(&snapshots, (&acme, "s-1"), &disk_of(vms[0], None)).await;
    clock.advance(TimeDelta::hours(2));
    project(&db).await;
    // The tenant deletes the latest; GC sweeps before the projection has that deletion.
    snapshots.delete(&acme, "d-1", latest).await.expect("deleting");
    let gc = SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1));
    let swept = gc.sweep(clock.now()).await.expect("swept");
    assert_eq!((swept.due, swept.deleting, swept.kept, swept.failed), (1, 0, 1, 0), "{swept:?}");
    let (_, stored) = snapshots.owned(older).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Ready, "the VM keeps a snapshot");
    // With the latest standing, the older one is collected, and the latest records it.
    let newest = ready_disk(&snapshots, (&acme, "s-2"), &disk_of(vms[0], None)).await;
    project(&db).await;
    let swept = gc.sweep(clock.now()).await.expect("swept");
    assert_eq!(swept.deleting, 1, "{swept:?}");
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT payload->>'collected' FROM events WHERE stream_id = $1 \
             AND event_type = 'SnapshotStoodAsLatest'",
            &[&newest.stream_id().as_str()],
        )
        .await
        .expect("the guard's record");
    assert_eq!(row.get::<_, String>(0), older.0.to_string());
}

#[tokio::test]
async fn a_creation_no_agent_answers_is_given_up_and_gives_its_quota_back() {
    let db = TestDb::migrated().await;
    let vms = running_vms(&db, 1).await;
    let clock = ManualClock::at(t0());
    let snapshots = snapshots(&db, &clock);
    let acme = tenant("acme");
    let stuck = snapshots.create(&acme, "s-0", &disk_of(vms[0], None)).await.expect("created");
    let owner = acme.tenant.clone().expect("a tenant");
    let quota = snapshots.quota(&owner).await.expect("readable").expect("opened");
    assert_eq!(quota.usage.count, 1);
    project(&db).await;
    let gc = SnapshotGc::new(snapshots.clone(), db.store(), TimeDelta::hours(1))
        .with_stuck_after(Some(TimeDelta::hours(1)));
    clock.advance(TimeDelta::minutes(30));
    assert_eq!(gc.sweep(clock.now()).await.expect("swept").given_up, 0, "not stuck yet");
    clock.advance(TimeDelta::hours(1));
    assert_eq!(gc.sweep(clock.now()).await.expect("swept").given_up, 1);
    let (_, stored) = snapshots.owned(stuck.snapshot).await.expect("stored");
    assert_eq!(stored.status, SnapshotStatus::Error);
    assert!(stored.last_error.is_some_and(|detail| detail.as_str().contains("no answer")));
    let quota = snapshots.quota(&owner).await.expect("readable").expect("opened");
    assert_eq!((quota.usage.count, quota.usage.bytes), (0, 0), "given back");
    // A later sweep over the projection's stale row repeats nothing.
    assert_eq!(gc.sweep(clock.now()).await.expect("swept").given_up, 0);
}
