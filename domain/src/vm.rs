//! The VM: a tenant's virtual machine on a host of the fleet, with the task it runs (one VM
//! per task) (DOMAIN.md §1.2).
//!
//! Its stored states are provisioning, running, draining and destroying, then removed, with
//! the outcome destroyed or failed. The **task** moves assigned → running → completed | failed
//! beside it. Placement happens inside Create: the command carries the placement decision,
//! and the VM service links the host's Reserve to it, so the VM's scheduling and its host's
//! reservation are one append with expected versions on both streams. Capacity is given
//! back (the host's Release, linked the same way) only on a boot failure and on a confirmed
//! removal: a VM being destroyed keeps its room until its host's agent confirms it is gone.
//!
//! Every piece of work its host's agent carries out (a boot, a destroy) is an **operation**,
//! named by the command that starts it. Each agent report names the operation it reports on;
//! one naming another than the current operation is `Fenced` before any row applies (a
//! report on a removed VM is ignored instead). The **generation** rises with every operation
//! and never falls: it is the dispatcher's name for the work.
//!
//! A command on a VM that does not exist (other than Create) is `NotFound`; a command the
//! table does not list for a state is `InvalidState`.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Create | provisioning | VmProvisioning, TaskAssigned, VmScheduled (the placement decision); linked: Reserve on the chosen host | the spec's own rules (`BadSpec`: counts in range, a GPU model only with GPUs, resuming a seed only with a seed and a pin, guest files unique and outside `/fuse`); startup-script timeout ≤ the fleet's maximum (`StartupTimeoutTooLarge`); proxy egress needs an egress registry (`NoEgressRegistry`); a pinned VM placed on its pin (`PinMismatch`) |
//! | any but none | Create | unchanged | refused | `TaskAlreadyAssigned` (a conflict: the task has its VM) |
//! | provisioning | ReportBooted | running | VmRunning, TaskRunning | — |
//! | running, draining | ReportBooted | unchanged | — (duplicate report) | — |
//! | provisioning | ReportBootFailed | removed (failed) | VmProvisionFailed, TaskFailed; linked: Release on the host | — |
//! | running | Drain | draining | VmDraining | — |
//! | draining | Drain | draining | — (idempotent; there is no undrain) | — |
//! | running, draining | Destroy | destroying | VmDestroying (requested), TaskFailed (force destroyed) | — |
//! | provisioning | Destroy | unchanged | refused | `InvalidState`: its boot is in flight, and a delete racing it could find nothing and free room the boot then takes; once it settles (running, or failed and removed), destroy it |
//! | destroying, removed | Destroy | unchanged | — (idempotent) | — |
//! | running, draining | CompleteTask | destroying | TaskCompleted, VmDestroying (task completed) | — |
//! | destroying | ConfirmRemoved | removed (destroyed) | VmRemoved; linked: Release on the host | — |
//! | running | Strike(reason) | running | VmStruck (1 strike) | the first, or after a strike of another reason |
//! | running, struck once for the reason | Strike(reason) | destroying | VmDestroying (stuck or idle), TaskFailed | — |
//! | running | ClearStrikes | running | VmStrikesCleared, or — without strikes | — |
//! | provisioning | Recover(running) | running | VmRecovered, VmRunning, TaskRunning | — |
//! | running, draining | Recover(running) | unchanged | — | — |
//! | provisioning, running, draining | Recover(missing) | destroying | VmRecovered, VmDestroying (missing), TaskFailed | — |
//! | destroying | Recover | unchanged | — (only a confirmed removal ends it) | — |
//! | running, draining | RecordActivity | unchanged | VmActive, or — within 60 s of the last recorded one | — |
//! | removed | any report (ReportBooted, ReportBootFailed, ConfirmRemoved, Recover) | unchanged | — (late reports are ignored) | — |
//! | none | Create(origin: fork or migration) | provisioning | VmProvisioning, VmCopied (its origin), TaskAssigned, VmScheduled; linked: Reserve on the chosen host | as Create |
//! | provisioning, a migration's copy | ReportBootFailed, Recover(missing) | as above | as above without TaskFailed: the task runs on at the source | — |
//! | running | Fork(fork) | running | VmForked; linked: the fork's Create(origin fork), Reserve on the source's host | no GPU (`GpuNotCopyable`); any other status `InvalidState` |
//! | running | Migrate(to, target, live, lazy) | running, migrating | VmMigrating; linked: the copy's Create(origin migration), Reserve on the target | no GPU; no migration in flight (`MigrationInFlight`); lazy needs live (`LazyNeedsLive`) and huge pages (`LazyNeedsHugePages`); live needs another host (`LiveNeedsOtherHost`); the same backend (`CrossBackend`); live only where the backend moves memory between hosts (`LiveUnsupported`: never a cold fallback); any other status `InvalidState` |
//! | running, migrating | Drain, Destroy, CompleteTask | unchanged | refused | `InvalidState` (status `migrating`): its copy is booting; once the copy settles (booted: the source is destroyed; failed: it runs on), ask again |
//! | running, migrating | Strike, ClearStrikes | unchanged | — (no reconcile judges it until its copy settles) | — |
//! | running, migrating to `to` | FinishMigration(to) (linked from the copy's boot) | destroying | VmMigrated (its task moved), VmDestroying (migrated) | — |
//! | any other | FinishMigration | unchanged | — (destroyed meanwhile: the copy runs on) | — |
//! | migrating to `to` | AbandonMigration(to) (linked from the copy's failed boot) | unchanged, no longer migrating | VmMigrationAbandoned | — |
//! | any other | AbandonMigration | unchanged | — | — |
//!
//! Destroy, ConfirmRemoved and Recover need no operation of their own from the caller:
//! Destroy starts one (its id in the command), ConfirmRemoved and Recover name the one they
//! report on. Strikes are consecutive: a reconcile that finds the VM neither stuck nor idle
//! clears them.

mod decide;
mod events;
mod evolve;
mod moves;
mod values;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::values::fleet::{HostId, TaskId, VmId};
use crate::values::{FieldError, OperationId, OperatorDetail, Reason, TenantMessage};
use crate::workload_quota::{Charge, WorkloadKind};

pub use events::{KIND, VmEvent};
pub use moves::{
    CopyKind, MigrateRequest, Migration, VmOrigin, check_migration, copyable, migratable,
    moves_memory_between_hosts,
};
pub use values::{
    CredentialRef, ExposedPort, GuestPath, ImageName, Placement, PlacementPolicy, Protocol,
    RESERVED_GUEST_DIR, SnapshotRef, VmSpec, VmUrl,
};

/// Where a VM stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmStatus {
    /// No VM yet: the stream is empty.
    None,
    /// Scheduled on a host, booting.
    Provisioning,
    /// Booted.
    Running,
    /// Finishing its work; it takes no new work and is never undrained.
    Draining,
    /// Being destroyed; its host's room stays held until the removal is confirmed.
    Destroying,
    /// Gone from its host (destroyed, or its boot failed).
    Removed,
}

impl VmStatus {
    /// Every status.
    pub const ALL: [Self; 6] = [
        Self::None,
        Self::Provisioning,
        Self::Running,
        Self::Draining,
        Self::Destroying,
        Self::Removed,
    ];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Provisioning => "provisioning",
            Self::Running => "running",
            Self::Draining => "draining",
            Self::Destroying => "destroying",
            Self::Removed => "removed",
        }
    }

    /// Whether its host's agent may still hold it.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Provisioning | Self::Running | Self::Draining)
    }
}

/// How a removed VM ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmOutcome {
    /// Destroyed after its removal was confirmed.
    Destroyed,
    /// Its boot failed.
    Failed,
}

/// Where the task a VM runs stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Given its VM.
    Assigned,
    /// Its VM booted.
    Running,
    /// Done.
    Completed,
    /// Ended without completing.
    Failed,
    /// Moved with its VM's migration: it runs on in the copy.
    Moved,
}

/// Why a VM is being destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DestroyReason {
    /// Its tenant (or an operator) asked.
    Requested,
    /// Its task completed.
    TaskCompleted,
    /// Running past its maximum runtime, on two reconciles in a row.
    Stuck,
    /// Without activity past its idle timeout, on two reconciles in a row.
    Idle,
    /// Its host's agent no longer has it.
    Missing,
    /// Its migration's copy booted on the target host.
    Migrated,
}

/// What a strike is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrikeReason {
    /// Older than its maximum runtime.
    Stuck,
    /// Idle past its timeout.
    Idle,
}

impl From<StrikeReason> for DestroyReason {
    fn from(reason: StrikeReason) -> Self {
        match reason {
            StrikeReason::Stuck => Self::Stuck,
            StrikeReason::Idle => Self::Idle,
        }
    }
}

/// What a recovery lookup at the VM's host found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// The agent has it, reachable at this URL.
    Running {
        /// Where it is reached.
        url: VmUrl,
    },
    /// The agent does not have it.
    Missing,
}

/// A failed boot, as the VM records it (the detail redacted of the VM's secret values before
/// it gets here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootFailure {
    /// Tenant-safe reason.
    pub reason: Reason,
    /// Tenant-safe message.
    pub message: TenantMessage,
    /// Operator detail.
    pub detail: OperatorDetail,
}

/// What a VM is: set by Create and kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmTerms {
    /// The VM.
    pub id: VmId,
    /// Its task.
    pub task: TaskId,
    /// Its spec.
    pub spec: VmSpec,
    /// Its credentials' reference.
    pub credentials: CredentialRef,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

/// The VM aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vm {
    /// Where it stands.
    pub status: VmStatus,
    /// How it ended, once removed.
    pub outcome: Option<VmOutcome>,
    /// What it is.
    pub terms: Option<VmTerms>,
    /// Its task's state.
    pub task: Option<TaskStatus>,
    /// Where it was placed.
    pub placement: Option<Placement>,
    /// Where it is reached, once running.
    pub url: Option<VmUrl>,
    /// Its current operation.
    pub operation: Option<OperationId>,
    /// Rises with every operation.
    pub generation: u64,
    /// Why it is being destroyed.
    pub destroy_reason: Option<DestroyReason>,
    /// Its boot's failure.
    pub failure: Option<BootFailure>,
    /// Consecutive strikes and what for.
    pub strikes: Option<(StrikeReason, u32)>,
    /// When it booted.
    pub running_since: Option<DateTime<Utc>>,
    /// Its last recorded activity.
    pub last_activity: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
    /// What it is a copy of (a fork's or a migration's VM).
    pub origin: Option<VmOrigin>,
    /// Its migration in flight, while it is the source of one.
    pub migration: Option<Migration>,
}

impl Vm {
    /// The host it is placed on.
    pub fn host(&self) -> Option<&HostId> {
        self.placement.as_ref().map(|placement| &placement.host)
    }
}

/// What can be asked of a VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmCommand {
    /// Creates it, placed as decided.
    Create {
        /// The VM.
        vm: VmId,
        /// Its task.
        task: TaskId,
        /// Its spec.
        spec: Box<VmSpec>,
        /// Its credentials' reference (kept encrypted elsewhere).
        credentials: CredentialRef,
        /// Where it goes and why.
        placement: Placement,
        /// Its boot.
        operation: OperationId,
        /// What it is a copy of, for a fork or a migration.
        origin: Option<VmOrigin>,
    },
    /// Forks it: `fork` is created from a snapshot of it (linked), and it runs on as it was.
    Fork {
        /// The fork.
        fork: VmId,
    },
    /// Migrates it: the copy `request.to` is created on the target (linked); it runs on until
    /// the copy settles.
    Migrate {
        /// The migration and what its guards need.
        request: Box<MigrateRequest>,
    },
    /// Its migration's copy booted: it is destroyed.
    FinishMigration {
        /// The copy.
        to: VmId,
        /// Its destroy.
        operation: OperationId,
    },
    /// Its migration's copy failed: it runs on, untouched.
    AbandonMigration {
        /// The copy.
        to: VmId,
    },
    /// The host's agent booted it.
    ReportBooted {
        /// The boot.
        operation: OperationId,
        /// Where it is reached.
        url: VmUrl,
    },
    /// The host's agent could not boot it.
    ReportBootFailed {
        /// The boot.
        operation: OperationId,
        /// Why.
        failure: BootFailure,
    },
    /// Finishes its work and takes no more.
    Drain,
    /// Destroys it.
    Destroy {
        /// The destroy.
        operation: OperationId,
    },
    /// Its task is done: destroys it.
    CompleteTask {
        /// The destroy.
        operation: OperationId,
    },
    /// The host's agent no longer has it, after a destroy.
    ConfirmRemoved {
        /// The destroy.
        operation: OperationId,
    },
    /// A reconcile found it stuck or idle.
    Strike {
        /// What for.
        reason: StrikeReason,
    },
    /// A reconcile found it neither stuck nor idle.
    ClearStrikes,
    /// A recovery lookup at its host found it, or did not.
    Recover {
        /// The operation looked up.
        operation: OperationId,
        /// What was found.
        found: Found,
    },
    /// It was used (an exec, an attach).
    RecordActivity,
}

impl VmCommand {
    /// The operation an agent report names, if this is one.
    pub fn reported_operation(&self) -> Option<OperationId> {
        match self {
            Self::ReportBooted { operation, .. }
            | Self::ReportBootFailed { operation, .. }
            | Self::ConfirmRemoved { operation }
            | Self::Recover { operation, .. } => Some(*operation),
            _ => None,
        }
    }

    /// Its name, as refusals spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Fork { .. } => "fork",
            Self::Migrate { .. } => "migrate",
            Self::FinishMigration { .. } => "finish migration",
            Self::AbandonMigration { .. } => "abandon migration",
            Self::ReportBooted { .. } => "report booted",
            Self::ReportBootFailed { .. } => "report boot failed",
            Self::Drain => "drain",
            Self::Destroy { .. } => "destroy",
            Self::CompleteTask { .. } => "complete task",
            Self::ConfirmRemoved { .. } => "confirm removed",
            Self::Strike { .. } => "strike",
            Self::ClearStrikes => "clear strikes",
            Self::Recover { .. } => "recover",
            Self::RecordActivity => "record activity",
        }
    }
}

/// Facts a VM's commands need: the fleet's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmFacts {
    /// The largest startup-script timeout a VM may ask for, in seconds.
    pub startup_script_timeout_max_seconds: u32,
    /// Whether the fleet has an egress registry (proxy egress needs one).
    pub egress_registry: bool,
}

impl Default for VmFacts {
    fn default() -> Self {
        Self {
            startup_script_timeout_max_seconds:
                crate::limits::VM_STARTUP_SCRIPT_TIMEOUT_DEFAULT_MAX_SECONDS,
            egress_registry: false,
        }
    }
}

/// Why a VM command is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmError {
    /// The VM does not exist (for this tenant).
    #[error("no such VM")]
    NotFound,
    /// Not allowed in its state.
    #[error("a VM that is {status} cannot {command}")]
    InvalidState {
        /// Its status's name.
        status: &'static str,
        /// What was asked.
        command: &'static str,
    },
    /// A report on an operation that is not the VM's current one.
    #[error("the report names an operation the VM is no longer carrying out")]
    Fenced,
    /// The task already has its VM.
    #[error("the task already has a VM")]
    TaskAlreadyAssigned,
    /// The spec breaks one of its own rules.
    #[error("{0}")]
    BadSpec(FieldError),
    /// The startup script may not run that long.
    #[error("startupScriptTimeout must be at most {max} seconds")]
    StartupTimeoutTooLarge {
        /// The fleet's maximum.
        max: u32,
    },
    /// Proxy egress asked for with no egress registry.
    #[error("proxy egress needs an egress registry, and this fleet has none")]
    NoEgressRegistry,
    /// A pinned VM placed on another host.
    #[error("a pinned VM must be placed on its pinned host")]
    PinMismatch,
    /// A VM with GPUs cannot be forked or migrated.
    #[error(
        "a VM with GPUs cannot be forked or migrated: a passed-through device cannot be checkpointed"
    )]
    GpuNotCopyable,
    /// It is already the source of a migration in flight.
    #[error("the VM is already being migrated")]
    MigrationInFlight,
    /// A lazy migration that is not live.
    #[error("a lazy migration must be live")]
    LazyNeedsLive,
    /// A lazy migration of a VM booted without huge pages.
    #[error("a lazy migration needs a VM booted with huge pages")]
    LazyNeedsHugePages,
    /// A live migration to the VM's own host.
    #[error("a live migration needs a target host other than the VM's own")]
    LiveNeedsOtherHost,
    /// A migration to a host of another backend.
    #[error("a VM cannot migrate to a host of another backend")]
    CrossBackend,
    /// A live migration where the backend cannot carry a guest's memory between hosts (it never
    /// falls back to a cold one).
    #[error(
        "{backend} hosts cannot move a running guest's memory between hosts, and a live migration never falls back to a cold one"
    )]
    LiveUnsupported {
        /// The backend's name.
        backend: &'static str,
    },
    /// A migration to or from a host whose agent Leasehold does not call (it takes its work by
    /// subscription): moving a VM needs both agents called.
    #[error(
        "host {host}'s agent takes its work by subscription: a migration needs Leasehold to call the agents of both hosts"
    )]
    HostNotCalled {
        /// The host.
        host: HostId,
    },
    /// Placement found no host for it (decided before the VM's own command, and never
    /// recorded on its stream).
    #[error("no host can take the VM: {gate}")]
    NoHostFits {
        /// The gate that kept it off every host.
        gate: crate::host::Gate,
    },
}

impl Refusal for VmError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound => RefusalKind::NotFound,
            Self::InvalidState { .. }
            | Self::NoEgressRegistry
            | Self::PinMismatch
            | Self::NoHostFits { .. }
            | Self::GpuNotCopyable
            | Self::LazyNeedsHugePages
            | Self::LiveUnsupported { .. }
            | Self::HostNotCalled { .. } => RefusalKind::InvalidState,
            Self::Fenced => RefusalKind::Fenced,
            Self::TaskAlreadyAssigned | Self::MigrationInFlight => RefusalKind::Conflict,
            Self::BadSpec(_)
            | Self::StartupTimeoutTooLarge { .. }
            | Self::LazyNeedsLive
            | Self::LiveNeedsOtherHost
            | Self::CrossBackend => RefusalKind::BadInput,
        }
    }
}

impl Aggregate for Vm {
    const STREAM_TYPE: &'static str = "vm";
    const STATE_SCHEMA: u32 = 2;
    type Command = VmCommand;
    type Event = VmEvent;
    type Error = VmError;
    type Facts = VmFacts;
    const WORKLOAD: Option<WorkloadKind> = Some(WorkloadKind::Vm);

    /// A VM holds its vCPUs, GPUs and RAM while its host holds room for it, but for one VM
    /// only when migrating: its copy from its boot on (until then, and if it never boots, the
    /// source holds), its source until then (destroyed as migrated, it holds no more).
    fn charge(&self) -> Option<Charge> {
        // A migration's copy that never booted (its `url` comes with its boot) holds nothing,
        // whatever becomes of it: its source still holds.
        let unbooted_copy =
            matches!(self.origin, Some(VmOrigin::Migration { .. })) && self.url.is_none();
        let holds = match self.status {
            VmStatus::Provisioning | VmStatus::Destroying if unbooted_copy => false,
            VmStatus::Provisioning | VmStatus::Running | VmStatus::Draining => true,
            VmStatus::Destroying => self.destroy_reason != Some(DestroyReason::Migrated),
            VmStatus::None | VmStatus::Removed => false,
        };
        let spec = &self.terms.as_ref().filter(|_| holds)?.spec;
        Some(Charge::of([
            ("cpus".to_owned(), u64::from(spec.cpus)),
            ("gpus".to_owned(), u64::from(spec.gpus)),
            ("ram_mb".to_owned(), spec.ram_mb),
        ]))
    }
    /// A destroy the VM starts itself (the second strike, a missing VM) needs an operation.
    const NEW_IDS_PER_COMMAND: usize = 1;

    fn initial() -> Self {
        Self {
            status: VmStatus::None,
            outcome: None,
            terms: None,
            task: None,
            placement: None,
            url: None,
            operation: None,
            generation: 0,
            destroy_reason: None,
            failure: None,
            strikes: None,
            running_since: None,
            last_activity: None,
            updated_at: None,
            origin: None,
            migration: None,
        }
    }

    fn decide(&self, command: &VmCommand, ctx: &Context<VmFacts>) -> Result<Vec<VmEvent>, VmError> {
        decide::decide(self, command, ctx)
    }

    fn evolve(self, event: &VmEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        self.status == VmStatus::Removed
    }

    fn is_creation(command: &VmCommand) -> bool {
        matches!(command, VmCommand::Create { .. })
    }

    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }
}
