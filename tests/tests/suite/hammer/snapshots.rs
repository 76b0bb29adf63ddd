//! Snapshots under the hammer: 8 slots, each over a running VM of globex's of its own (on two
//! hosts of their own, so the VM kind's hosts and quota stay as they are), and globex's
//! snapshot quota below what 8 snapshots would hold (5 snapshots, 56 GiB; a disk snapshot
//! reserves an estimate of 10 GiB, a live one 12 GiB). A slot's snapshot is asked for, written
//! by its host's agent at an honest size (or its writing fails), restored, exported, deleted
//! and confirmed gone; then the slot asks for a new one. Now and then an agent reports on an
//! operation that is not the snapshot's current one (fenced).

use leasehold_adapters::{PgEventStore, PgReadModels, StoreConfig};
use leasehold_commands::CommandPipeline;
use leasehold_commands::lease_service::{Caller, minted_id};
use leasehold_commands::snapshot_service::{AgentReport, SnapshotConfig, SnapshotService};
use leasehold_domain::TenantId;
use leasehold_domain::quota::QuotaLimits;
use leasehold_domain::snapshot::{
    ExportDestination, ExportStatus, ReportedSizes, RequestedKind, Snapshot, SnapshotId,
    SnapshotKind, SnapshotStatus, Written,
};
use leasehold_domain::values::fleet::{HostBackend, HostId, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail};
use leasehold_domain::vm::{PlacementPolicy, SnapshotRef, VmUrl};
use leasehold_tests::TestDb;

use super::delivery::{Fault, Observer, deliver};
use super::{Answer, Rng, SLOTS, Slots, Via, answer};
use crate::fleet::support::{
    agent, host_spec, no_secrets, register, service, snapshot_ask, spec, task, tenant,
};

type Service = SnapshotService<PgEventStore, PgReadModels>;

const GIB: u64 = 1 << 30;
/// An operation no snapshot or export of this run was ever given.
const STALE: OperationId = OperationId(uuid::Uuid::from_u128(7));
/// globex's snapshot quota: fewer than the slots' snapshots could hold.
const LIMITS: QuotaLimits = QuotaLimits { max_count: 5, max_bytes: 56 * GIB };

pub struct Snapshots {
    slots: Slots<SnapshotId>,
    /// Each slot's VM, running throughout.
    vms: Vec<VmId>,
    processes: [Service; 2],
}

/// What one step works with.
struct Turn<'a> {
    snapshots: &'a Service,
    delivery: (Fault, &'a Observer),
    key: &'a str,
    tenant: Caller,
    agent: Caller,
}

impl Snapshots {
    pub async fn new(db: &TestDb, pipelines: &[CommandPipeline<PgEventStore>; 2]) -> Snapshots {
        let hosts = ["snapshots-0", "snapshots-1"];
        for host in hosts {
            register(db, host, host_spec(HostBackend::Firecracker, 16, 8)).await;
        }
        let vms = running_vms(db, &hosts).await;
        let listing = PgReadModels::of(
            &db.store_with(StoreConfig { pool_size: 2, ..StoreConfig::default() }),
        );
        let over = |pipeline: &CommandPipeline<PgEventStore>| {
            SnapshotService::new(pipeline.clone(), listing.clone(), SnapshotConfig::default())
        };
        let processes = [over(&pipelines[0]), over(&pipelines[1])];
        let operator = super::vms::operator();
        let owner = globex();
        let set = processes[0].set_limits(&operator, "snapshot-limits", (&owner, LIMITS));
        set.await.expect("set");
        Snapshots { slots: Slots::new(), vms, processes }
    }

    pub async fn step(&self, (process, delivery): Via<'_>, rng: &mut Rng, key: String) -> Answer {
        let turn = Turn {
            snapshots: &self.processes[process],
            delivery,
            key: &key,
            tenant: tenant("globex"),
            agent: agent(),
        };
        let slot = rng.below(SLOTS);
        let (round, snapshot) = self.slots.get(slot);
        let Some(snapshot) = snapshot else {
            let requested = if rng.one_in(2) { RequestedKind::Disk } else { RequestedKind::Live };
            let ask = snapshot_ask(self.vms[slot], requested);
            let create = || turn.snapshots.create(&turn.tenant, turn.key, &ask);
            let answered = deliver(turn.delivery, create).await;
            if matches!(answered, Answer::Applied) {
                let id = SnapshotId(minted_id("snapshot", &globex(), &key));
                self.slots.created(slot, round, id);
            }
            return answered;
        };
        let stored = match turn.snapshots.owned(snapshot).await {
            Ok((_, stored)) => stored,
            Err(error) => return answer::<(), _>(Err(error)),
        };
        match next(&turn, (snapshot, &stored), (self.vms[slot], rng)).await {
            Some(answered) => answered,
            None => self.slots.ended(slot, round),
        }
    }
}

/// The command the snapshot's state calls for, sent; none once it is deleted.
async fn next(
    turn: &Turn<'_>,
    (snapshot, stored): (SnapshotId, &Snapshot),
    (vm, rng): (VmId, &mut Rng),
) -> Option<Answer> {
    let snapshots = turn.snapshots;
    let current = stored.operation.unwrap_or(OperationId(uuid::Uuid::nil()));
    // Now and then a report of an operation that is not the current one.
    let stale = rng.one_in(8);
    let operation = if stale { STALE } else { current };
    let report = match (stored.status, rng.below(8)) {
        (SnapshotStatus::Creating, 0) => {
            let detail = OperatorDetail::new("the checkpoint failed");
            AgentReport::WriteFailed { operation, detail }
        }
        (SnapshotStatus::Creating, _) => {
            AgentReport::Written { operation, written: written(stored, rng) }
        }
        (SnapshotStatus::Restoring, _) => AgentReport::Restored { operation },
        (SnapshotStatus::Deleting, _) => AgentReport::Deleted { operation, not_found: false },
        (SnapshotStatus::Ready, 0..=1) => {
            let restore = || snapshots.restore(&turn.tenant, turn.key, (snapshot, vm));
            return Some(deliver(turn.delivery, restore).await);
        }
        (SnapshotStatus::Ready, 2..=3) => {
            return Some(export(turn, (snapshot, stored), stale).await);
        }
        (SnapshotStatus::Ready | SnapshotStatus::Error, _) => {
            let delete = || snapshots.delete(&turn.tenant, turn.key, snapshot);
            return Some(deliver(turn.delivery, delete).await);
        }
        (SnapshotStatus::Deleted | SnapshotStatus::None, _) => return None,
    };
    let host = stored.terms.as_ref().map(|terms| terms.host.clone()).expect("its host");
    Some(reported(turn, (&host, snapshot), report).await)
}

/// An export asked for, or the pending one written.
async fn export(
    turn: &Turn<'_>,
    (snapshot, stored): (SnapshotId, &Snapshot),
    stale: bool,
) -> Answer {
    let pending = stored.exports.iter().find(|export| export.status == ExportStatus::Pending);
    let Some(pending) = pending else {
        let destination = ExportDestination::parse("destination", "s3://exports/hammer");
        let asked = (snapshot, destination.expect("valid"));
        let request = || turn.snapshots.request_export(&turn.tenant, turn.key, asked.clone());
        return deliver(turn.delivery, request).await;
    };
    let operation = match pending.operation {
        Some(current) if !stale => current,
        _ => STALE,
    };
    let report = AgentReport::Exported {
        destination: pending.destination.clone(),
        operation,
        ready: true,
        detail: None,
    };
    let host = stored.terms.as_ref().map(|terms| terms.host.clone()).expect("its host");
    reported(turn, (&host, snapshot), report).await
}

async fn reported(
    turn: &Turn<'_>,
    (host, snapshot): (&HostId, SnapshotId),
    report: AgentReport,
) -> Answer {
    let send = || turn.snapshots.report(&turn.agent, (host, turn.key), snapshot, report.clone());
    deliver(turn.delivery, send).await
}

/// What the agent wrote: the kind asked for, at an honest size of its own (which may be above
/// the estimate reserved).
fn written(stored: &Snapshot, rng: &mut Rng) -> Written {
    let live = stored.terms.as_ref().is_some_and(|terms| terms.requested == RequestedKind::Live);
    let (kind, memory_bytes) =
        if live { (SnapshotKind::Live, 2 * GIB) } else { (SnapshotKind::Disk, 0) };
    Written {
        kind,
        sizes: ReportedSizes { disk_bytes: (1 + rng.below(12) as u64) * GIB, memory_bytes },
        digest: None,
        store_ref: SnapshotRef::parse("ref", "hammer").expect("valid"),
        diff_of: None,
    }
}

/// One VM of globex's per slot, placed on `hosts` and booted by its agent.
async fn running_vms(db: &TestDb, hosts: &[&str]) -> Vec<VmId> {
    let vms = service(db, hosts, PlacementPolicy::Spread);
    let mut running = Vec::new();
    for slot in 0..SLOTS {
        let key = format!("snapshot-vm-{slot}");
        let placed = (&task(&key), spec());
        let created = vms.create(&tenant("globex"), &key, placed, &no_secrets()).await;
        let vm = created.expect("placed").vm;
        let (_, stored) = vms.owned(vm).await.expect("stored");
        let boot = stored.operation.expect("a boot");
        let host = stored.placement.expect("placed").host;
        let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
        let (agent, key) = (agent(), format!("{key}-booted"));
        vms.report_booted(&agent, &host, &key, vm, (boot, url)).await.expect("booted");
        running.push(vm);
    }
    running
}

fn globex() -> TenantId {
    TenantId::parse("globex").expect("valid")
}
