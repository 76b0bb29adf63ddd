//! The snapshot's GraphQL types.

use async_graphql::{Enum, ID, InputObject, Json, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{SnapshotQuotaUsage as UsageRow, SnapshotSummary};
use leasehold_domain::snapshot::{RequestedKind, SnapshotKind, SnapshotMode};

/// A snapshot as its tenant sees it. Never its operations, its store reference or operator
/// detail.
#[derive(Debug, Clone, SimpleObject)]
pub struct Snapshot {
    /// Its id.
    pub id: ID,
    /// The VM it was taken of.
    pub vm_id: ID,
    /// The VM's task.
    pub task_id: String,
    /// The host holding it.
    pub host_id: String,
    /// `creating`, `ready`, `restoring`, `deleting`, `error` or `deleted`.
    pub state: String,
    /// `manual`, `auto` or `build`.
    pub mode: String,
    /// What was asked: `disk`, `live` or `diff`.
    pub requested: String,
    /// What the host's agent wrote: `disk` or `live` (none until it is ready).
    pub kind: Option<String>,
    /// A diff's parent.
    pub parent_snapshot_id: Option<ID>,
    /// A build layer's cache key.
    pub layer_key: Option<String>,
    /// The building host's architecture.
    pub arch: String,
    /// The sha256 of its rootfs (an integrity check, never an identity).
    pub digest: Option<String>,
    /// Your name for it.
    pub name: Option<String>,
    /// Its size in bytes: the estimate until ready, then the honest size (memory included
    /// for a live snapshot).
    pub size_bytes: i64,
    /// When retention GC may delete it.
    pub retention_until: Option<DateTime<Utc>>,
    /// Its exports: destination, status (`pending`, `ready`, `error`) and times.
    pub exports: Json<serde_json::Value>,
    /// When it was asked for.
    pub created_at: DateTime<Utc>,
    /// When a layer cache hit last used it.
    pub last_used: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<SnapshotSummary> for Snapshot {
    fn from(row: SnapshotSummary) -> Self {
        Self {
            id: ID(row.snapshot_id.0.to_string()),
            vm_id: ID(row.vm_id.to_string()),
            task_id: row.task_id,
            host_id: row.host_id,
            state: row.state,
            mode: row.mode,
            requested: row.requested,
            kind: row.kind,
            parent_snapshot_id: row.parent_snapshot_id.map(|id| ID(id.to_string())),
            layer_key: row.layer_key,
            arch: row.arch,
            digest: row.digest,
            name: row.name,
            size_bytes: row.size_bytes,
            retention_until: row.retention_until,
            exports: Json(row.exports),
            created_at: row.created_at,
            last_used: row.last_used,
            updated_at: row.updated_at,
        }
    }
}

/// A tenant's snapshot quota: what it counts (creating, ready and restoring snapshots,
/// build artifacts excluded) against its limits (0: no limit).
#[derive(Debug, Clone, SimpleObject)]
pub struct SnapshotQuotaUsage {
    /// The tenant: shown to operators, who see every tenant's; none to a tenant.
    pub tenant_id: Option<String>,
    /// Snapshots counted.
    pub count: i64,
    /// Their bytes.
    pub bytes: i64,
    /// Most snapshots (0: no limit).
    pub max_count: i64,
    /// Most bytes (0: no limit).
    pub max_bytes: i64,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

impl From<UsageRow> for SnapshotQuotaUsage {
    fn from(row: UsageRow) -> Self {
        Self {
            tenant_id: Some(row.tenant_id),
            count: row.count,
            bytes: row.bytes,
            max_count: row.max_count,
            max_bytes: row.max_bytes,
            updated_at: row.updated_at,
        }
    }
}

/// What a snapshot captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[graphql(name = "SnapshotRequestKind")]
pub enum RequestKind {
    /// The rootfs only.
    Disk,
    /// The rootfs and the guest's memory (the guest pauses while it is written).
    Live,
    /// What changed since the VM's last live snapshot (its parent); never restored alone.
    Diff,
}

impl From<RequestKind> for RequestedKind {
    fn from(kind: RequestKind) -> Self {
        match kind {
            RequestKind::Disk => Self::Disk,
            RequestKind::Live => Self::Live,
            RequestKind::Diff => Self::Diff,
        }
    }
}

/// What a host's agent wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[graphql(name = "SnapshotWrittenKind")]
pub enum WrittenKind {
    /// The rootfs only.
    Disk,
    /// The rootfs and the guest's memory.
    Live,
}

impl From<WrittenKind> for SnapshotKind {
    fn from(kind: WrittenKind) -> Self {
        match kind {
            WrittenKind::Disk => Self::Disk,
            WrittenKind::Live => Self::Live,
        }
    }
}

/// Who takes a snapshot and what for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[graphql(name = "SnapshotMode")]
pub enum Mode {
    /// You asked for it.
    Manual,
    /// An automated process took it.
    Auto,
    /// A build artifact: never collected by retention GC, never counted by the quota.
    Build,
}

impl From<Mode> for SnapshotMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Manual => Self::Manual,
            Mode::Auto => Self::Auto,
            Mode::Build => Self::Build,
        }
    }
}

/// A snapshot asked of one of your running VMs.
#[derive(Debug, Clone, InputObject)]
pub struct CreateSnapshotInput {
    /// Your idempotency key: a retry with it answers the first outcome.
    pub operation_key: String,
    /// The VM.
    pub vm_id: ID,
    /// What to capture (default `DISK`).
    pub kind: Option<RequestKind>,
    /// Default `MANUAL`.
    pub mode: Option<Mode>,
    /// A diff's parent (default: the VM's last live snapshot; any other is refused).
    pub parent_snapshot_id: Option<ID>,
    /// A build layer's cache key (`BUILD` mode only).
    pub layer_key: Option<String>,
    /// Your name for it.
    pub name: Option<String>,
    /// When retention GC may delete it (default: the fleet's default retention from now).
    pub retention_until: Option<DateTime<Utc>>,
}

/// A command on one of your snapshots.
#[derive(Debug, Clone, InputObject)]
pub struct SnapshotOperationInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
}

/// A restore of one of your snapshots onto its VM.
#[derive(Debug, Clone, InputObject)]
pub struct RestoreSnapshotInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// Its VM (another VM is `NOT_FOUND`).
    pub vm_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
}

/// An export of one of your ready snapshots.
#[derive(Debug, Clone, InputObject)]
pub struct ExportSnapshotInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// An `s3://`, `gs://` or `https://` URL without credentials.
    pub destination: String,
    /// Your idempotency key.
    pub operation_key: String,
}

/// The seed's filters on `snapshots` (exact matches; none: all of yours).
#[derive(Debug, Clone, Default, InputObject)]
pub struct SnapshotFilter {
    /// Only this VM's.
    pub vm_id: Option<ID>,
    /// Only this task's.
    pub task_id: Option<String>,
    /// Only in this state.
    pub state: Option<String>,
    /// Only of this mode.
    pub mode: Option<Mode>,
    /// Only with this layer key.
    pub layer_key: Option<String>,
    /// Only built on this arch.
    pub arch: Option<String>,
    /// Only with this name.
    pub name: Option<String>,
}

/// A host agent's report that it wrote a snapshot of its host.
#[derive(Debug, Clone, InputObject)]
pub struct ConfirmSnapshotInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The creation's operation (another is `FENCED`).
    pub operation_id: ID,
    /// What was written (a live request served as disk is `DISK`).
    pub kind: WrittenKind,
    /// The rootfs (or a diff's changed blocks), in bytes.
    pub disk_bytes: u64,
    /// The guest memory written beside it, in bytes (live only).
    pub memory_bytes: Option<u64>,
    /// The rootfs's sha256, when hashed.
    pub digest: Option<String>,
    /// Its reference in the host's store.
    pub store_ref: String,
    /// The snapshot a diff was written over (none: written in full).
    pub diff_of: Option<ID>,
}

/// What failed, in a host agent's failure report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum SnapshotStage {
    /// Writing it.
    Create,
    /// Restoring it.
    Restore,
    /// Deleting it.
    Delete,
}

/// A host agent's report on one operation of a snapshot of its host.
#[derive(Debug, Clone, InputObject)]
pub struct SnapshotReportInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The operation reported on (another is `FENCED`).
    pub operation_id: ID,
}

/// A host agent's failure report on a snapshot of its host.
#[derive(Debug, Clone, InputObject)]
pub struct SnapshotFailureInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The operation reported on (another is `FENCED`).
    pub operation_id: ID,
    /// What failed.
    pub stage: SnapshotStage,
    /// A restore's snapshot is no longer in the store.
    pub missing: Option<bool>,
    /// Why (operators only).
    pub detail: Option<String>,
}

/// A host agent's report on an export of a snapshot of its host.
#[derive(Debug, Clone, InputObject)]
pub struct SnapshotExportReportInput {
    /// The snapshot.
    pub snapshot_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The export's operation, as it was sent (an earlier request's is `FENCED`).
    pub operation_id: ID,
    /// Where it was exported to.
    pub destination: String,
    /// Whether it was written (else it failed).
    pub ready: bool,
    /// Why it failed (operators only).
    pub detail: Option<String>,
}

/// An operator's limits on a tenant's snapshots (0: no limit).
#[derive(Debug, Clone, InputObject)]
pub struct SnapshotQuotaInput {
    /// The tenant.
    pub tenant_id: String,
    /// Most snapshots counted at once.
    pub max_count: u32,
    /// Most bytes counted at once.
    pub max_bytes: u64,
    /// Your idempotency key.
    pub operation_key: String,
}

/// A layer cache lookup that records its hit.
#[derive(Debug, Clone, InputObject)]
pub struct UseLayerInput {
    /// The layer key.
    pub layer_key: String,
    /// The arch it must have been built on.
    pub arch: String,
    /// Your idempotency key.
    pub operation_key: String,
}
