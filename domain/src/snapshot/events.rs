//! The snapshot's stored events, and what its tenant may see of each: never the failure
//! detail (`detail`), the operation ids agents report on, or the host's store reference.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{DeleteCause, ExportDestination, SnapshotTerms, Written};
use crate::registry::{AggregateKind, EventView};
use crate::values::{OperationId, OperatorDetail};

/// Everything that can happen to a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum SnapshotEvent {
    /// A snapshot was asked of the VM's host.
    SnapshotRequested { terms: SnapshotTerms, operation: OperationId, at: DateTime<Utc> },
    /// The host's agent wrote it: `size_bytes` is its honest size.
    SnapshotCreated { written: Written, size_bytes: u64, at: DateTime<Utc> },
    /// The host's agent could not write it.
    SnapshotFailed { detail: OperatorDetail, at: DateTime<Utc> },
    /// A restore onto its VM was asked for.
    SnapshotRestoring { operation: OperationId, at: DateTime<Utc> },
    /// It was restored.
    SnapshotRestored { at: DateTime<Utc> },
    /// Its restore failed (`missing`: the host's store no longer had it).
    SnapshotRestoreFailed { missing: bool, detail: OperatorDetail, at: DateTime<Utc> },
    /// Its deletion was asked for.
    SnapshotDeleting { cause: DeleteCause, operation: OperationId, at: DateTime<Utc> },
    /// It is gone (`not_found`: the host no longer had it).
    SnapshotDeleted { cause: DeleteCause, not_found: bool, at: DateTime<Utc> },
    /// Its deletion failed.
    SnapshotDeleteFailed {
        cause: DeleteCause,
        failures: u32,
        detail: OperatorDetail,
        at: DateTime<Utc>,
    },
    /// Retention GC failed to delete it this many times in a row: a dead letter.
    SnapshotGcDeadLettered { failures: u32, at: DateTime<Utc> },
    /// An export was asked for.
    SnapshotExportRequested {
        destination: ExportDestination,
        at: DateTime<Utc>,
        /// The export's operation (absent in events recorded before exports had one).
        #[serde(default)]
        operation: Option<OperationId>,
    },
    /// An export was written.
    SnapshotExported { destination: ExportDestination, at: DateTime<Utc> },
    /// An export failed.
    SnapshotExportFailed {
        destination: ExportDestination,
        detail: OperatorDetail,
        at: DateTime<Utc>,
    },
    /// A layer cache hit used it.
    SnapshotUsed { at: DateTime<Utc> },
    /// A diff over it is being created.
    SnapshotChildAdopted { child: super::SnapshotId, at: DateTime<Utc> },
    /// A diff over it is being deleted.
    SnapshotChildReleased { child: super::SnapshotId, at: DateTime<Utc> },
    /// It stood as its VM's latest while retention GC collected `collected`, an older one.
    SnapshotStoodAsLatest { collected: super::SnapshotId, at: DateTime<Utc> },
}

crate::tagged_events!(SnapshotEvent {
    SnapshotRequested,
    SnapshotCreated,
    SnapshotFailed,
    SnapshotRestoring,
    SnapshotRestored,
    SnapshotRestoreFailed,
    SnapshotDeleting,
    SnapshotDeleted,
    SnapshotDeleteFailed,
    SnapshotGcDeadLettered,
    SnapshotExportRequested,
    SnapshotExported,
    SnapshotExportFailed,
    SnapshotUsed,
    SnapshotChildAdopted,
    SnapshotChildReleased,
    SnapshotStoodAsLatest,
});

/// The terms a tenant sees of its snapshot's request (all but the host, the fleet's).
const TERMS: &[&str] = &[
    "terms.snapshot",
    "terms.vm",
    "terms.task",
    // The host its VM runs on, which the tenant sees of the VM (its placement) and of the
    // snapshot's row.
    "terms.host",
    "terms.arch",
    "terms.mode",
    "terms.requested",
    "terms.parent",
    "terms.layer_key",
    "terms.name",
    "terms.retention_until",
    "terms.estimate_bytes",
    "at",
];

/// The snapshot kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "snapshot",
    events: &[
        view("SnapshotRequested", TERMS, &["operation"]),
        view(
            "SnapshotCreated",
            &[
                "written.kind",
                "written.sizes.disk_bytes",
                "written.sizes.memory_bytes",
                "written.digest",
                "written.diff_of",
                "size_bytes",
                "at",
            ],
            &["written.store_ref"],
        ),
        view("SnapshotFailed", AT, &["detail"]),
        view("SnapshotRestoring", AT, &["operation"]),
        view("SnapshotRestored", AT, &[]),
        view("SnapshotRestoreFailed", &["missing", "at"], &["detail"]),
        view("SnapshotDeleting", &["cause", "at"], &["operation"]),
        view("SnapshotDeleted", &["cause", "not_found", "at"], &[]),
        view("SnapshotDeleteFailed", &["cause", "at"], &["failures", "detail"]),
        view("SnapshotGcDeadLettered", &[], &["failures", "at"]),
        view("SnapshotExportRequested", &["destination", "at"], &["operation"]),
        view("SnapshotExported", &["destination", "at"], &[]),
        view("SnapshotExportFailed", &["destination", "at"], &["detail"]),
        view("SnapshotUsed", AT, &[]),
        view("SnapshotStoodAsLatest", &["collected", "at"], &[]),
        view("SnapshotChildAdopted", &["child", "at"], &[]),
        view("SnapshotChildReleased", &["child", "at"], &[]),
    ],
};

const AT: &[&str] = &["at"];

const fn view(
    event_type: &'static str,
    tenant_fields: &'static [&'static str],
    withheld: &'static [&'static str],
) -> EventView {
    EventView { event_type, tenant_fields, withheld }
}
