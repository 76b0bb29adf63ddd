//! The Snapshot: a checkpoint of a running VM held in its host's store (DOMAIN.md §1.3).
//!
//! A tenant asks for a snapshot of its running VM; Leasehold records it as `creating` and the
//! VM's host agent takes it. The agent's confirmation makes it `ready` with what the agent
//! **actually** wrote: its kind as reported (a live request served as disk is filed as disk),
//! its honest size (memory included for a live one), its digest, and its host's store
//! reference; its architecture is the building host's, recorded at creation from the host's
//! registration and never taken from the caller. A snapshot is restored onto its own VM,
//! deleted by its tenant, by retention GC or by the layer cache's eviction, and exported to
//! object storage. Every agent report names the snapshot's current operation: a report of
//! another operation is `Fenced`.
//!
//! Facts the service looks up before deciding ([`SnapshotFacts`]): whether the VM is running
//! and has GPUs, the VM's last live snapshot, the snapshot's children still alive, and
//! whether it is its VM's latest.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Create(terms) | creating | SnapshotRequested | VM running (`VmNotRunning`); no GPU (`GpuUnsupported`); a diff's parent is the VM's last live snapshot (`DiffNeedsLiveParent`); a layer key only in build mode (`LayerKeyNeedsBuild`) |
//! | any but none | Create | unchanged | — when the same terms (a retry), else `AlreadyExists` | — |
//! | creating | Confirm(op, kind, sizes, digest, ref) | ready | SnapshotCreated (honest size) | the current operation (`Fenced`) |
//! | creating | Fail(op, detail) | error | SnapshotFailed | the current operation |
//! | ready | Restore(vm, op) | restoring | SnapshotRestoring | the snapshot's own VM (`NotFound` otherwise); VM running (`VmNotRunning`); a diff (as the agent wrote it) is never restored on its own (`DiffNotRestorable`) |
//! | restoring | Restore(same op) | restoring | — (a retry) | the same VM, else `NotFound` |
//! | restoring | ConfirmRestore(op) | ready | SnapshotRestored | the current operation |
//! | restoring | FailRestore(op, missing, detail) | error | SnapshotRestoreFailed (`last_error` "snapshot missing from provider" when missing, else the detail) | the current operation |
//! | ready, error | Delete(op, cause) | deleting | SnapshotDeleting | no child alive, by its own adopted diffs or the listing's (`HasLiveChildren`); GC: never a build artifact (`BuildArtifact`), only past its retention (`RetentionNotPassed`), never its VM's latest (`LatestOfVm`); eviction: only layers (`NotALayer`) |
//! | deleting, deleted | Delete | unchanged | — (idempotent) | — |
//! | creating, restoring | Delete | unchanged | refused | `InvalidState` |
//! | deleting | ConfirmDeleted(op, not_found) | deleted | SnapshotDeleted (a provider's not-found is a deletion too) | the current operation |
//! | deleting | FailDelete(op, detail) | error | SnapshotDeleteFailed; by GC, from the Nth failure in a row on (facts: N, default 5) also SnapshotGcDeadLettered | the current operation |
//! | ready | RequestExport(destination, op) | ready | SnapshotExportRequested (pending, op) | — when that destination is already pending or ready |
//! | ready, restoring, error, deleting | ReportExport(destination, op, ready or error) | unchanged | SnapshotExported / SnapshotExportFailed; — when that export already settled as reported (a redelivery), else `ReportContradicts` | an export there (`NoSuchExport`) of that operation (`Fenced`: an earlier request's report never settles a later one) |
//! | deleted | ReportExport | deleted | — (a redelivery) | — |
//! | ready | Use | ready | SnapshotUsed (a layer cache hit: least recently used is evicted first) | a layer (`NotALayer`) |
//! | ready, restoring | AdoptChild(diff, vm) | unchanged | SnapshotChildAdopted, or — when adopted already | live as written, of the diff's VM (`ParentNotLive`); linked to the diff's creation |
//! | any but none | ReleaseChild(diff) | unchanged | SnapshotChildReleased, or — when not a child | linked to the diff's deletion |
//! | ready, restoring | StandAsLatest(older) | unchanged | SnapshotStoodAsLatest | linked to GC's deletion of its VM's older snapshot (elsewhere `InvalidState`, which keeps that one: a latest deleted meanwhile no longer stands) |
//! | deleted | anything else | deleted | refused | `InvalidState` |
//!
//! Agents' reports on a deleted snapshot are taken as redeliveries (no events), as the VM's
//! are on a removed VM, and so is a report of the current operation once it settled as the
//! report says (a confirmation of the same write sent again after the snapshot became ready);
//! one that contradicts how it settled (a failure after its success, a success after its
//! failure, another write) is `ReportContradicts` (`CONFLICT`), never a silent success. The tenant's snapshot quota follows the states that count
//! ([`Snapshot::counts`]): the command service links the quota's reservation to the
//! creation, its settlement to the confirmation, and its release to every move out of the
//! counted states (`quota_effect`).

mod decide;
mod events;
mod evolve;
pub mod values;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::values::fleet::{Arch, HostId, TaskId, VmId};
use crate::values::{OperationId, OperatorDetail};
use crate::vm::SnapshotRef;

pub use events::{KIND, SnapshotEvent};
pub use values::{
    Digest, Export, ExportDestination, ExportStatus, LayerKey, ReportedSizes, RequestedKind,
    SnapshotId, SnapshotKind, SnapshotMode, SnapshotName,
};

/// Where a snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStatus {
    /// Never asked for: the stream is empty.
    None,
    /// Asked of the host's agent, not confirmed yet.
    Creating,
    /// Held by its host.
    Ready,
    /// Being restored onto its VM.
    Restoring,
    /// Being deleted at its host.
    Deleting,
    /// A creation, restore or deletion failed (`last_error`, operators only).
    Error,
    /// Gone.
    Deleted,
}

impl SnapshotStatus {
    /// Every status.
    pub const ALL: [Self; 7] = [
        Self::None,
        Self::Creating,
        Self::Ready,
        Self::Restoring,
        Self::Deleting,
        Self::Error,
        Self::Deleted,
    ];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Creating => "creating",
            Self::Ready => "ready",
            Self::Restoring => "restoring",
            Self::Deleting => "deleting",
            Self::Error => "error",
            Self::Deleted => "deleted",
        }
    }
}

/// Who deletes a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteCause {
    /// Its tenant.
    Tenant,
    /// Retention GC: its retention passed.
    Gc,
    /// The layer cache: its tenant's layers exceeded the cap and it was the least recently
    /// used.
    Evicted,
}

impl DeleteCause {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Gc => "gc",
            Self::Evicted => "evicted",
        }
    }
}

/// What a snapshot was asked to be: fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotTerms {
    /// Its id.
    pub snapshot: SnapshotId,
    /// The VM it is taken of.
    pub vm: VmId,
    /// The VM's task.
    pub task: TaskId,
    /// The host that takes it (the VM's).
    pub host: HostId,
    /// The building host's architecture, from its registration (never the caller's).
    pub arch: Arch,
    /// Who takes it and what for.
    pub mode: SnapshotMode,
    /// What was asked of the agent.
    pub requested: RequestedKind,
    /// Its parent: a diff's base (the VM's last live snapshot); none for a full snapshot. (A
    /// lineage link from every snapshot to the one before would keep each while its successor
    /// lives, and retention GC, which skips parents, could delete none.)
    pub parent: Option<SnapshotId>,
    /// A build artifact's cache key.
    pub layer_key: Option<LayerKey>,
    /// Its tenant's name for it.
    pub name: Option<SnapshotName>,
    /// When GC may delete it (none: never by retention).
    pub retention_until: Option<DateTime<Utc>>,
    /// The bytes its quota reservation holds until its honest size is known.
    pub estimate_bytes: u64,
}

/// What a host's agent reports it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// Its kind as written.
    pub kind: SnapshotKind,
    /// Its sizes.
    pub sizes: ReportedSizes,
    /// Its rootfs's sha256, when the agent hashes.
    pub digest: Option<Digest>,
    /// Its reference in the host's store.
    pub store_ref: SnapshotRef,
    /// The snapshot a diff was written over, as the agent reports it (none: a full snapshot,
    /// whatever was asked). A diff is never restored on its own.
    pub diff_of: Option<SnapshotId>,
}

/// The Snapshot aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Where it stands.
    pub status: SnapshotStatus,
    /// What it was asked to be (set by its creation).
    pub terms: Option<SnapshotTerms>,
    /// What the agent wrote (set by its confirmation).
    pub written: Option<Written>,
    /// Its size in bytes: the estimate until confirmed, then the honest size.
    pub size_bytes: u64,
    /// The operation agents' reports must name.
    pub operation: Option<OperationId>,
    /// Who is deleting it, while it is being or was deleted.
    pub deletion: Option<DeleteCause>,
    /// GC deletions failed in a row.
    pub gc_failures: u32,
    /// Its exports.
    pub exports: Vec<Export>,
    /// The last failure (operators only).
    pub last_error: Option<OperatorDetail>,
    /// When it was asked for.
    pub created_at: Option<DateTime<Utc>>,
    /// When a layer cache hit last used it (else when it became ready).
    pub last_used: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
    /// The diffs over it that are not being deleted: each adopted in its own creation's
    /// append, released in its deletion's, so that its deletion is refused on its own state.
    pub children: std::collections::BTreeSet<SnapshotId>,
}

/// What can be asked of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotCommand {
    /// Asks the VM's host to take it.
    Create {
        /// What it is to be.
        terms: Box<SnapshotTerms>,
        /// The creation's operation (the agent's confirmation names it).
        operation: OperationId,
    },
    /// The agent wrote it.
    Confirm {
        /// The operation reported on.
        operation: OperationId,
        /// What it wrote.
        written: Written,
    },
    /// The agent could not write it.
    Fail {
        /// The operation reported on.
        operation: OperationId,
        /// Why (redacted before it reaches the command).
        detail: OperatorDetail,
    },
    /// Restores it onto its VM.
    Restore {
        /// The VM asked for (it must be the snapshot's own).
        vm: VmId,
        /// The restore's operation.
        operation: OperationId,
    },
    /// The agent restored it.
    ConfirmRestore {
        /// The operation reported on.
        operation: OperationId,
    },
    /// The agent could not restore it.
    FailRestore {
        /// The operation reported on.
        operation: OperationId,
        /// Whether the agent's store no longer has it.
        missing: bool,
        /// Why.
        detail: OperatorDetail,
    },
    /// Deletes it.
    Delete {
        /// The deletion's operation.
        operation: OperationId,
        /// Who deletes it.
        cause: DeleteCause,
    },
    /// The agent deleted it, or did not have it.
    ConfirmDeleted {
        /// The operation reported on.
        operation: OperationId,
        /// Whether the agent answered not-found.
        not_found: bool,
    },
    /// The agent could not delete it.
    FailDelete {
        /// The operation reported on.
        operation: OperationId,
        /// Why.
        detail: OperatorDetail,
    },
    /// Asks for an export.
    RequestExport {
        /// Where to.
        destination: ExportDestination,
        /// The export's operation (the agent's report names it).
        operation: OperationId,
    },
    /// The agent reports on an export.
    ReportExport {
        /// Where to.
        destination: ExportDestination,
        /// The export's operation.
        operation: OperationId,
        /// Whether it was written (else it failed).
        ready: bool,
        /// Why it failed.
        detail: Option<OperatorDetail>,
    },
    /// A layer cache hit used it.
    Use,
    /// A diff over it is being created (linked to the diff's creation).
    AdoptChild {
        /// The diff.
        child: SnapshotId,
        /// The diff's VM (it must be this snapshot's).
        vm: VmId,
    },
    /// A diff over it is being deleted (linked to the diff's deletion).
    ReleaseChild {
        /// The diff.
        child: SnapshotId,
    },
    /// Retention GC collects `collected`, an older snapshot of this one's VM, because this one
    /// is the VM's latest (linked to that deletion: this one must still be ready or being
    /// restored in the log, not merely in the projection GC read).
    StandAsLatest {
        /// The older snapshot collected.
        collected: SnapshotId,
    },
}

impl SnapshotCommand {
    /// Its name, for refusals.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Confirm { .. } => "confirm",
            Self::Fail { .. } => "fail",
            Self::Restore { .. } => "restore",
            Self::ConfirmRestore { .. } => "confirm a restore",
            Self::FailRestore { .. } => "fail a restore",
            Self::Delete { .. } => "delete",
            Self::ConfirmDeleted { .. } => "confirm a deletion",
            Self::FailDelete { .. } => "fail a deletion",
            Self::RequestExport { .. } => "export",
            Self::ReportExport { .. } => "report an export",
            Self::Use => "use",
            Self::AdoptChild { .. } => "adopt a diff",
            Self::ReleaseChild { .. } => "release a diff",
            Self::StandAsLatest { .. } => "stand as its VM's latest",
        }
    }

    /// The operation an agent's report names, if it is one.
    pub fn reported_operation(&self) -> Option<OperationId> {
        match self {
            Self::Confirm { operation, .. }
            | Self::Fail { operation, .. }
            | Self::ConfirmRestore { operation }
            | Self::FailRestore { operation, .. }
            | Self::ConfirmDeleted { operation, .. }
            | Self::FailDelete { operation, .. } => Some(*operation),
            _ => None,
        }
    }
}

/// Why a snapshot refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// No such snapshot (for this tenant), or not of this VM.
    #[error("snapshot not found")]
    NotFound,
    /// Not allowed in its state.
    #[error("a snapshot that is {status} cannot {command}")]
    InvalidState {
        /// Its status's name.
        status: &'static str,
        /// What was asked.
        command: &'static str,
    },
    /// The VM is not running.
    #[error("the VM is not running: snapshots and restores need a running VM")]
    VmNotRunning,
    /// The VM has GPUs passed through, which cannot be checkpointed.
    #[error("the VM has a GPU passthrough device: snapshots are not supported for GPU VMs")]
    GpuUnsupported,
    /// A diff's parent is not the VM's last live snapshot.
    #[error("a diff snapshot needs the VM's last live snapshot as its parent{}", last_live.map(|id| format!(" ({id})")).unwrap_or_else(|| ": the VM has none".into()))]
    DiffNeedsLiveParent {
        /// The VM's last live snapshot, if any.
        last_live: Option<SnapshotId>,
    },
    /// A diff is only a delta over its parent.
    #[error("a diff snapshot is never restored on its own")]
    DiffNotRestorable,
    /// A layer key on a snapshot that is not a build artifact.
    #[error("only a build snapshot may have a layer key")]
    LayerKeyNeedsBuild,
    /// Children are still alive.
    #[error("the snapshot has {count} children that are not being deleted")]
    HasLiveChildren {
        /// How many.
        count: usize,
    },
    /// GC never deletes a build artifact.
    #[error("retention GC never deletes a build artifact")]
    BuildArtifact,
    /// GC deletes only past the retention.
    #[error("the snapshot's retention has not passed")]
    RetentionNotPassed,
    /// GC never deletes a VM's latest snapshot.
    #[error("retention GC never deletes a VM's latest snapshot")]
    LatestOfVm,
    /// Only layers are in the layer cache (used by its hits, evicted by its cap).
    #[error("only a layer artifact is used by or evicted from the layer cache")]
    NotALayer,
    /// The snapshot exists with other terms.
    #[error("a snapshot with this id exists with other terms")]
    AlreadyExists,
    /// No export is pending at that destination.
    #[error("no export of the snapshot is pending there")]
    NoSuchExport,
    /// A diff's parent is not a ready live snapshot of the diff's VM.
    #[error("a diff's parent must be a ready live snapshot of the same VM")]
    ParentNotLive,
    /// A report of another operation than the snapshot's current one.
    #[error("the report is for another operation than the snapshot's current one")]
    Fenced,
    /// A report of an operation that settled otherwise (a failure after its success, or
    /// another write than the one recorded): never taken as a redelivery.
    #[error("the operation already settled otherwise than this report says")]
    ReportContradicts,
}

impl Refusal for SnapshotError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound | Self::NoSuchExport => RefusalKind::NotFound,
            Self::LayerKeyNeedsBuild => RefusalKind::BadInput,
            Self::InvalidState { .. }
            | Self::VmNotRunning
            | Self::GpuUnsupported
            | Self::DiffNeedsLiveParent { .. }
            | Self::DiffNotRestorable
            | Self::HasLiveChildren { .. }
            | Self::BuildArtifact
            | Self::RetentionNotPassed
            | Self::LatestOfVm
            | Self::NotALayer
            | Self::ParentNotLive => RefusalKind::InvalidState,
            Self::AlreadyExists | Self::ReportContradicts => RefusalKind::Conflict,
            Self::Fenced => RefusalKind::Fenced,
        }
    }
}

/// What a snapshot's commands are decided with, looked up by the service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFacts {
    /// Whether the VM (the snapshot's, or the one asked for) is running.
    pub vm_running: bool,
    /// The VM's GPUs.
    pub vm_gpus: u32,
    /// The VM's last live snapshot.
    pub last_live: Option<SnapshotId>,
    /// The snapshot's children that are not being deleted.
    pub live_children: usize,
    /// GC failures in a row that make a dead letter (0: the default, 5).
    pub gc_dead_letter_after: u32,
    /// Whether the snapshot is its VM's latest (GC never deletes that one).
    pub latest_of_vm: bool,
}

/// GC failures in a row that make a dead letter when the facts name none.
pub const GC_DEAD_LETTER_AFTER_DEFAULT: u32 = 5;

impl Aggregate for Snapshot {
    const STREAM_TYPE: &'static str = "snapshot";
    const STATE_SCHEMA: u32 = 3;
    type Command = SnapshotCommand;
    type Event = SnapshotEvent;
    type Error = SnapshotError;
    type Facts = SnapshotFacts;

    fn initial() -> Self {
        Self {
            status: SnapshotStatus::None,
            terms: None,
            written: None,
            size_bytes: 0,
            operation: None,
            deletion: None,
            gc_failures: 0,
            exports: Vec::new(),
            last_error: None,
            created_at: None,
            last_used: None,
            updated_at: None,
            children: std::collections::BTreeSet::new(),
        }
    }

    fn decide(
        &self,
        command: &SnapshotCommand,
        ctx: &Context<SnapshotFacts>,
    ) -> Result<Vec<SnapshotEvent>, SnapshotError> {
        decide::decide(self, command, &ctx.facts, ctx.now)
    }

    fn evolve(self, event: &SnapshotEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        self.status == SnapshotStatus::Deleted
    }

    fn is_creation(command: &SnapshotCommand) -> bool {
        matches!(command, SnapshotCommand::Create { .. })
    }
}

impl Snapshot {
    /// Whether its tenant's snapshot quota counts it now: creating, ready or restoring, and
    /// not a build artifact.
    pub fn counts(&self) -> bool {
        let counted = matches!(
            self.status,
            SnapshotStatus::Creating | SnapshotStatus::Ready | SnapshotStatus::Restoring
        );
        counted && self.terms.as_ref().is_some_and(|terms| terms.mode.counts_for_quota())
    }

    /// Whether it is a layer artifact (a build snapshot with a layer key).
    pub fn is_layer(&self) -> bool {
        self.terms
            .as_ref()
            .is_some_and(|terms| terms.mode == SnapshotMode::Build && terms.layer_key.is_some())
    }
}

/// The tenant quota command that must commit with `events` decided on `before` (the
/// service links it to the snapshot's command, on the tenant's quota stream): a reservation
/// when the snapshot starts counting (on its estimate), a settlement when a counted
/// snapshot's size changes (to its honest size), a release when it stops counting. `None`
/// when the quota is not concerned (a build artifact never counts).
pub fn quota_effect(
    before: &Snapshot,
    events: &[SnapshotEvent],
) -> Option<crate::quota::QuotaCommand> {
    use crate::quota::QuotaCommand;
    let after = events.iter().fold(before.clone(), |state, event| state.evolve(event));
    let snapshot = after.terms.as_ref()?.snapshot;
    match (before.counts(), after.counts()) {
        (false, true) => Some(QuotaCommand::Reserve { snapshot, bytes: after.size_bytes }),
        (true, true) if after.size_bytes != before.size_bytes => {
            Some(QuotaCommand::Settle { snapshot, bytes: after.size_bytes })
        }
        (true, false) => Some(QuotaCommand::Release { snapshot }),
        _ => None,
    }
}
