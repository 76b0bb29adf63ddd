//! The snapshot's state after each event: no rules, only what the event records.

use super::{Export, ExportStatus, Snapshot, SnapshotEvent as E, SnapshotStatus as S};

/// What a restore of a snapshot its host no longer has records, as upstream does.
pub const MISSING: &str = "snapshot missing from provider";

pub(super) fn evolve(mut snapshot: Snapshot, event: &E) -> Snapshot {
    match event {
        E::SnapshotRequested { terms, operation, at } => {
            snapshot.status = S::Creating;
            snapshot.terms = Some(terms.clone());
            snapshot.operation = Some(*operation);
            snapshot.size_bytes = terms.estimate_bytes;
            snapshot.created_at = Some(*at);
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotCreated { written, size_bytes, at } => {
            snapshot.status = S::Ready;
            snapshot.written = Some(written.clone());
            snapshot.size_bytes = *size_bytes;
            snapshot.last_used = Some(*at);
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotFailed { detail, at } => {
            snapshot.status = S::Error;
            snapshot.last_error = Some(detail.clone());
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotRestoring { operation, at } => {
            snapshot.status = S::Restoring;
            snapshot.operation = Some(*operation);
            snapshot.last_error = None;
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotRestored { at } => {
            snapshot.status = S::Ready;
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotRestoreFailed { missing, detail, at } => {
            snapshot.status = S::Error;
            snapshot.last_error = Some(if *missing {
                crate::values::OperatorDetail::new(MISSING)
            } else {
                detail.clone()
            });
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotDeleting { cause, operation, at } => {
            snapshot.status = S::Deleting;
            snapshot.deletion = Some(*cause);
            snapshot.operation = Some(*operation);
            snapshot.last_error = None;
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotDeleted { at, .. } => {
            snapshot.status = S::Deleted;
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotDeleteFailed { failures, detail, at, .. } => {
            snapshot.status = S::Error;
            snapshot.gc_failures = (*failures).max(snapshot.gc_failures);
            snapshot.last_error = Some(detail.clone());
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotGcDeadLettered { at, .. } => snapshot.updated_at = Some(*at),
        E::SnapshotExportRequested { destination, at, operation } => {
            snapshot.exports.retain(|export| export.destination != *destination);
            snapshot.exports.push(Export {
                destination: destination.clone(),
                status: ExportStatus::Pending,
                requested_at: *at,
                updated_at: *at,
                last_error: None,
                operation: *operation,
            });
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotExported { destination, at } => {
            settle(&mut snapshot, destination, ExportStatus::Ready, None, *at);
        }
        E::SnapshotExportFailed { destination, detail, at } => {
            settle(&mut snapshot, destination, ExportStatus::Error, Some(detail.clone()), *at);
        }
        E::SnapshotUsed { at } => snapshot.last_used = Some(*at),
        // A guard's record: nothing of the snapshot changes.
        E::SnapshotStoodAsLatest { .. } => {}
        E::SnapshotChildAdopted { child, at } => {
            snapshot.children.insert(*child);
            snapshot.updated_at = Some(*at);
        }
        E::SnapshotChildReleased { child, at } => {
            snapshot.children.remove(child);
            snapshot.updated_at = Some(*at);
        }
    }
    snapshot
}

fn settle(
    snapshot: &mut Snapshot,
    destination: &super::ExportDestination,
    status: ExportStatus,
    detail: Option<crate::values::OperatorDetail>,
    at: chrono::DateTime<chrono::Utc>,
) {
    for export in snapshot.exports.iter_mut().filter(|export| export.destination == *destination) {
        export.status = status;
        export.updated_at = at;
        export.last_error = detail.clone();
    }
    snapshot.updated_at = Some(at);
}
