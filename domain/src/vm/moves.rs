//! Forks and migrations: a copy of a running VM, booted as a VM of its own (its own stream,
//! task run, credentials and host reservation), from a snapshot its host's agent takes of the
//! source.
//!
//! The source records that it was asked (`VmForked`, `VmMigrating`) in the same append as its
//! copy's creation and the copy's host reservation. A fork leaves the source as it is. A
//! migration holds the source (running, migrating) until its copy settles: the copy's boot
//! finishes it (`VmMigrated`, and the source is destroyed), the copy's failure abandons it
//! (`VmMigrationAbandoned`, the source running as before: a failed migration never touches
//! the guest it would have moved).
//!
//! The guards (DOMAIN.md §1.2, rule 29) are the source's, in this order: running; no GPU (a
//! passed-through device cannot be checkpointed); lazy needs live; lazy needs a VM booted
//! with huge pages; live needs a target other than the source's host; never across backends
//! (a rootfs prepared for one cannot boot on another); live only where the backend can carry
//! a guest's memory between hosts, since a live migration never falls back to a cold one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Vm, VmError, VmEvent, VmStatus};
use crate::values::fleet::{HostBackend, HostId, VmId};

/// What a VM was copied from, recorded on the copy's stream when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmOrigin {
    /// A fork of `source`, which keeps running.
    Fork {
        /// The VM forked.
        source: VmId,
    },
    /// The migration of `source`, which is destroyed once this copy boots.
    Migration {
        /// The VM migrated.
        source: VmId,
        /// Whether the guest's memory was to move with it.
        live: bool,
        /// Whether the copy was to resume before its memory arrived.
        lazy: bool,
        /// Since when the source ran: the copy's age counts from it, so that moving a VM
        /// never resets its maximum runtime.
        running_since: Option<DateTime<Utc>>,
    },
}

impl VmOrigin {
    /// The VM copied.
    pub fn source(self) -> VmId {
        match self {
            Self::Fork { source } | Self::Migration { source, .. } => source,
        }
    }

    /// As its event records it (flat: every copy's event has the same fields).
    pub(super) fn recorded(self, at: DateTime<Utc>) -> VmEvent {
        let (kind, live, lazy, since) = match self {
            Self::Fork { .. } => (CopyKind::Fork, false, false, None),
            Self::Migration { live, lazy, running_since, .. } => {
                (CopyKind::Migration, live, lazy, running_since)
            }
        };
        VmEvent::VmCopied { source: self.source(), kind, live, lazy, since, at }
    }

    /// The origin its event recorded.
    pub(super) fn of_recorded(
        source: VmId,
        kind: CopyKind,
        (live, lazy): (bool, bool),
        since: Option<DateTime<Utc>>,
    ) -> Self {
        match kind {
            CopyKind::Fork => Self::Fork { source },
            CopyKind::Migration => Self::Migration { source, live, lazy, running_since: since },
        }
    }
}

/// What kind of copy a VM is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    /// A fork.
    Fork,
    /// A migration.
    Migration,
}

/// A migration in flight, as its source holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// The copy being booted.
    pub to: VmId,
    /// The copy's host.
    pub target: HostId,
    /// Whether the guest's memory moves.
    pub live: bool,
    /// Whether the copy resumes before its memory arrived.
    pub lazy: bool,
}

/// A migration asked for, with the facts its guards need (looked up by the VM service, as a
/// create's placement is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateRequest {
    /// The copy (its VM id).
    pub to: VmId,
    /// The copy's host.
    pub target: HostId,
    /// Carry the guest's memory across and resume it there.
    pub live: bool,
    /// Resume before the memory has arrived (needs live and huge pages).
    pub lazy: bool,
    /// The source host's backend.
    pub source_backend: HostBackend,
    /// The target host's backend.
    pub target_backend: HostBackend,
}

/// Whether `backend`'s host agents can move a running guest's memory to another host. None
/// can today: fuse's agent moves a snapshot between hosts as one file, its disk, so a live
/// snapshot reaches another host without its memory (`docs/fuse-host-agent-protocol.md` §4).
pub fn moves_memory_between_hosts(backend: HostBackend) -> bool {
    match backend {
        HostBackend::Firecracker | HostBackend::Qemu => false,
    }
}

/// The guards of a fork (`command` "fork") or a migration that only the source decides:
/// running, and no GPU. A service checks them before it places the copy, so that a VM that
/// cannot be copied is told so rather than that no host has room.
///
/// # Errors
/// `InvalidState` or `GpuNotCopyable`.
pub fn copyable(vm: &Vm, command: &'static str) -> Result<(), VmError> {
    if vm.status != VmStatus::Running {
        return Err(VmError::InvalidState { status: vm.status.name(), command });
    }
    // Whole GPUs or a MIG instance alike: neither can be checkpointed.
    if vm.terms.as_ref().is_some_and(|terms| terms.spec.demand().wants_gpu()) {
        return Err(VmError::GpuNotCopyable);
    }
    Ok(())
}

/// Fork: the source records its fork and is otherwise left as it is.
pub(super) fn fork(vm: &Vm, fork: VmId, at: DateTime<Utc>) -> Decision {
    copyable(vm, "fork")?;
    Ok(vec![VmEvent::VmForked { fork, at }])
}

type Decision = Result<Vec<VmEvent>, VmError>;

/// Migrate: every guard in order, then the source holds the migration.
pub(super) fn migrate(vm: &Vm, request: &MigrateRequest, at: DateTime<Utc>) -> Decision {
    check_migration(vm, request)?;
    Ok(vec![VmEvent::VmMigrating {
        to: request.to,
        target: request.target.clone(),
        live: request.live,
        lazy: request.lazy,
        at,
    }])
}

/// Every guard of `request` on `vm`, in order: [`migratable`], then live needs another host,
/// the same backend, and live only where the backend moves memory between hosts.
///
/// # Errors
/// The first guard that refuses.
pub fn check_migration(vm: &Vm, request: &MigrateRequest) -> Result<(), VmError> {
    migratable(vm, request.live, request.lazy)?;
    if request.live && vm.host() == Some(&request.target) {
        return Err(VmError::LiveNeedsOtherHost);
    }
    if request.source_backend != request.target_backend {
        return Err(VmError::CrossBackend);
    }
    if request.live && !moves_memory_between_hosts(request.source_backend) {
        return Err(VmError::LiveUnsupported { backend: request.source_backend.name() });
    }
    Ok(())
}

/// The guards of a migration that do not depend on its target, in order: copyable, no
/// migration in flight, lazy needs live and huge pages. Checked before placement as
/// [`copyable`] is.
///
/// # Errors
/// The first guard that refuses.
pub fn migratable(vm: &Vm, live: bool, lazy: bool) -> Result<(), VmError> {
    copyable(vm, "migrate")?;
    if vm.migration.is_some() {
        return Err(VmError::MigrationInFlight);
    }
    if lazy && !live {
        return Err(VmError::LazyNeedsLive);
    }
    let huge_pages = vm.terms.as_ref().is_some_and(|terms| terms.spec.huge_pages);
    if lazy && !huge_pages {
        return Err(VmError::LazyNeedsHugePages);
    }
    Ok(())
}

/// Whether `vm` is migrating to `to`.
pub(super) fn migrating_to(vm: &Vm, to: VmId) -> bool {
    vm.migration.as_ref().is_some_and(|migration| migration.to == to)
}
