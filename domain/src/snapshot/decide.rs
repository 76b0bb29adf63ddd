//! The snapshot's transition table (the module doc of `snapshot.rs`), as code.

use chrono::{DateTime, Utc};

use super::{
    DeleteCause, ExportStatus, GC_DEAD_LETTER_AFTER_DEFAULT, RequestedKind, Snapshot,
    SnapshotCommand as C, SnapshotError, SnapshotEvent as E, SnapshotFacts, SnapshotStatus as S,
    SnapshotTerms,
};

type Decided = Result<Vec<E>, SnapshotError>;

pub(super) fn decide(
    snapshot: &Snapshot,
    command: &C,
    facts: &SnapshotFacts,
    at: DateTime<Utc>,
) -> Decided {
    if snapshot.status == S::None && !matches!(command, C::Create { .. }) {
        return Err(SnapshotError::NotFound);
    }
    if let Some(operation) = command.reported_operation() {
        // A report on a deleted snapshot is a redelivery: nothing is left to change.
        if snapshot.status == S::Deleted {
            return Ok(Vec::new());
        }
        if snapshot.operation != Some(operation) {
            return Err(SnapshotError::Fenced);
        }
        // The current operation's report once it settled (sent again, under another key): a
        // redelivery, as a report on a deleted snapshot is.
        if !awaits(snapshot.status, command) {
            return if settled_as(snapshot, command) {
                Ok(Vec::new())
            } else {
                Err(SnapshotError::ReportContradicts)
            };
        }
    }
    let invalid =
        || SnapshotError::InvalidState { status: snapshot.status.name(), command: command.name() };
    match (snapshot.status, command) {
        (S::None, C::Create { terms, operation }) => {
            check_create(terms, facts)?;
            let terms = (**terms).clone();
            Ok(vec![E::SnapshotRequested { terms, operation: *operation, at }])
        }
        (_, C::Create { terms, .. }) if snapshot.terms.as_ref() == Some(terms) => Ok(Vec::new()),
        (_, C::Create { .. }) => Err(SnapshotError::AlreadyExists),
        (S::Creating, C::Confirm { written, .. }) => {
            let size_bytes = written.sizes.honest(written.kind);
            Ok(vec![E::SnapshotCreated { written: written.clone(), size_bytes, at }])
        }
        (S::Creating, C::Fail { detail, .. }) => {
            Ok(vec![E::SnapshotFailed { detail: detail.clone(), at }])
        }
        (S::Ready, C::Restore { vm, operation }) => {
            let terms = snapshot.terms.as_ref().ok_or(SnapshotError::NotFound)?;
            if terms.vm != *vm {
                return Err(SnapshotError::NotFound);
            }
            // As written, not as asked: a diff request the agent served in full restores.
            if snapshot.written.as_ref().is_some_and(|written| written.diff_of.is_some()) {
                return Err(SnapshotError::DiffNotRestorable);
            }
            if !facts.vm_running {
                return Err(SnapshotError::VmNotRunning);
            }
            Ok(vec![E::SnapshotRestoring { operation: *operation, at }])
        }
        (S::Restoring, C::Restore { vm, operation }) if snapshot.operation == Some(*operation) => {
            // The same operation for another VM contradicts the one recorded.
            let own = snapshot.terms.as_ref().is_some_and(|terms| terms.vm == *vm);
            if own { Ok(Vec::new()) } else { Err(SnapshotError::NotFound) }
        }
        (S::Restoring, C::ConfirmRestore { .. }) => Ok(vec![E::SnapshotRestored { at }]),
        (S::Restoring, C::FailRestore { missing, detail, .. }) => {
            Ok(vec![E::SnapshotRestoreFailed { missing: *missing, detail: detail.clone(), at }])
        }
        (S::Ready | S::Error, C::Delete { operation, cause }) => {
            check_delete(snapshot, *cause, facts, at)?;
            Ok(vec![E::SnapshotDeleting { cause: *cause, operation: *operation, at }])
        }
        (S::Deleting | S::Deleted, C::Delete { .. }) => Ok(Vec::new()),
        (S::Deleting, C::ConfirmDeleted { not_found, .. }) => {
            let cause = snapshot.deletion.unwrap_or(DeleteCause::Tenant);
            Ok(vec![E::SnapshotDeleted { cause, not_found: *not_found, at }])
        }
        (S::Deleting, C::FailDelete { detail, .. }) => {
            Ok(delete_failed(snapshot, detail, facts, at))
        }
        (S::Ready, C::RequestExport { destination, operation }) => {
            let known = snapshot.exports.iter().any(|export| {
                export.destination == *destination && export.status != ExportStatus::Error
            });
            if known {
                return Ok(Vec::new());
            }
            let destination = destination.clone();
            Ok(vec![E::SnapshotExportRequested { destination, at, operation: Some(*operation) }])
        }
        // An export's report on a deleted snapshot is a redelivery, as every agent report is.
        (S::Deleted, C::ReportExport { .. }) => Ok(Vec::new()),
        // An export asked while ready settles whatever the snapshot went through since (a
        // failed restore, a deletion under way): the agent may have written it meanwhile.
        (
            S::Ready | S::Restoring | S::Error | S::Deleting,
            C::ReportExport { destination, operation, ready, detail },
        ) => report_export(snapshot, (destination, *operation), (*ready, detail.as_ref()), at),
        (S::Ready | S::Restoring, C::AdoptChild { child, vm }) => adopt(snapshot, *child, *vm, at),
        (_, C::ReleaseChild { child }) if snapshot.children.contains(child) => {
            Ok(vec![E::SnapshotChildReleased { child: *child, at }])
        }
        (_, C::ReleaseChild { .. }) => Ok(Vec::new()),
        (_, C::AdoptChild { .. }) => Err(SnapshotError::ParentNotLive),
        (S::Ready, C::Use) if snapshot.is_layer() => Ok(vec![E::SnapshotUsed { at }]),
        (S::Ready, C::Use) => Err(SnapshotError::NotALayer),
        (S::Ready | S::Restoring, C::StandAsLatest { collected }) => {
            Ok(vec![E::SnapshotStoodAsLatest { collected: *collected, at }])
        }
        _ => Err(invalid()),
    }
}

/// A diff's adoption: only by a live snapshot (as written) of the diff's own VM.
fn adopt(
    snapshot: &Snapshot,
    child: super::SnapshotId,
    vm: crate::values::fleet::VmId,
    at: DateTime<Utc>,
) -> Decided {
    let live = snapshot.written.as_ref().is_some_and(|w| w.kind == super::SnapshotKind::Live);
    let same_vm = snapshot.terms.as_ref().is_some_and(|terms| terms.vm == vm);
    if !live || !same_vm {
        return Err(SnapshotError::ParentNotLive);
    }
    if snapshot.children.contains(&child) {
        return Ok(Vec::new());
    }
    Ok(vec![E::SnapshotChildAdopted { child, at }])
}

/// Whether a snapshot in `status` awaits the agent's report `command`.
fn awaits(status: S, command: &C) -> bool {
    match command {
        C::Confirm { .. } | C::Fail { .. } => status == S::Creating,
        C::ConfirmRestore { .. } | C::FailRestore { .. } => status == S::Restoring,
        C::ConfirmDeleted { .. } | C::FailDelete { .. } => status == S::Deleting,
        _ => true,
    }
}

/// Whether the current operation, settled, settled as `report` says (a redelivery).
fn settled_as(snapshot: &Snapshot, report: &C) -> bool {
    let failed = snapshot.status == S::Error;
    match report {
        C::Confirm { written, .. } => snapshot.written.as_ref() == Some(written),
        C::Fail { .. } => failed && snapshot.written.is_none(),
        C::ConfirmRestore { .. } | C::ConfirmDeleted { .. } => !failed,
        C::FailRestore { .. } | C::FailDelete { .. } => failed,
        _ => true,
    }
}

/// A create's guards, in the seed's order: the VM, then its capability, then the request.
fn check_create(terms: &SnapshotTerms, facts: &SnapshotFacts) -> Result<(), SnapshotError> {
    if !facts.vm_running {
        return Err(SnapshotError::VmNotRunning);
    }
    if facts.vm_gpus > 0 {
        return Err(SnapshotError::GpuUnsupported);
    }
    if terms.requested == RequestedKind::Diff
        && (facts.last_live.is_none() || terms.parent != facts.last_live)
    {
        return Err(SnapshotError::DiffNeedsLiveParent { last_live: facts.last_live });
    }
    if terms.layer_key.is_some() && terms.mode != super::SnapshotMode::Build {
        return Err(SnapshotError::LayerKeyNeedsBuild);
    }
    Ok(())
}

/// A deletion's guards: no child alive, and GC and eviction each on their own artifacts (GC:
/// never a build artifact, only past its retention, never its VM's latest snapshot).
fn check_delete(
    snapshot: &Snapshot,
    cause: DeleteCause,
    facts: &SnapshotFacts,
    at: DateTime<Utc>,
) -> Result<(), SnapshotError> {
    // Its own adopted diffs are exact; the listing's count covers diffs made before parents
    // adopted them.
    let live_children = facts.live_children.max(snapshot.children.len());
    if live_children > 0 {
        return Err(SnapshotError::HasLiveChildren { count: live_children });
    }
    let terms = snapshot.terms.as_ref().ok_or(SnapshotError::NotFound)?;
    match cause {
        DeleteCause::Gc if terms.mode == super::SnapshotMode::Build => {
            Err(SnapshotError::BuildArtifact)
        }
        DeleteCause::Gc if terms.retention_until.is_none_or(|until| until > at) => {
            Err(SnapshotError::RetentionNotPassed)
        }
        DeleteCause::Gc if facts.latest_of_vm => Err(SnapshotError::LatestOfVm),
        DeleteCause::Evicted if !snapshot.is_layer() => Err(SnapshotError::NotALayer),
        _ => Ok(()),
    }
}

/// A failed deletion; by GC, counted, and a dead letter from the Nth failure in a row on.
fn delete_failed(
    snapshot: &Snapshot,
    detail: &crate::values::OperatorDetail,
    facts: &SnapshotFacts,
    at: DateTime<Utc>,
) -> Vec<E> {
    let cause = snapshot.deletion.unwrap_or(DeleteCause::Tenant);
    let failures = if cause == DeleteCause::Gc { snapshot.gc_failures + 1 } else { 0 };
    let mut events = vec![E::SnapshotDeleteFailed { cause, failures, detail: detail.clone(), at }];
    let after = match facts.gc_dead_letter_after {
        0 => GC_DEAD_LETTER_AFTER_DEFAULT,
        n => n,
    };
    // From the Nth failure in a row on, each one is recorded on the dead letter (one per
    // snapshot, its count raised), so lowering N below a count already reached still files it.
    if cause == DeleteCause::Gc && failures >= after {
        events.push(E::SnapshotGcDeadLettered { failures, at });
    }
    events
}

/// An agent's report on the export to `destination` of `operation`: settled once; a report of
/// another request's operation (an earlier attempt's, answered late) is fenced off, so it
/// never settles the request pending now.
fn report_export(
    snapshot: &Snapshot,
    (destination, operation): (&super::ExportDestination, crate::values::OperationId),
    (ready, detail): (bool, Option<&crate::values::OperatorDetail>),
    at: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<E>, SnapshotError> {
    let export = snapshot.exports.iter().find(|export| export.destination == *destination);
    let Some(export) = export else { return Err(SnapshotError::NoSuchExport) };
    if export.operation.is_some_and(|current| current != operation) {
        return Err(SnapshotError::Fenced);
    }
    match (export.status, export.operation) {
        (ExportStatus::Pending, _) => {}
        // Settled as this report says: a redelivery; otherwise it contradicts it.
        (ExportStatus::Ready, Some(_)) if ready => return Ok(Vec::new()),
        (ExportStatus::Error, Some(_)) if !ready => return Ok(Vec::new()),
        (_, Some(_)) => return Err(SnapshotError::ReportContradicts),
        // Settled, recorded before exports had operations: nothing pending to report on.
        (_, None) => return Err(SnapshotError::NoSuchExport),
    }
    let destination = destination.clone();
    Ok(vec![if ready {
        E::SnapshotExported { destination, at }
    } else {
        let detail = detail
            .cloned()
            .unwrap_or_else(|| crate::values::OperatorDetail::new("the agent reported no detail"));
        E::SnapshotExportFailed { destination, detail, at }
    }])
}
