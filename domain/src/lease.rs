//! The Lease: rented compute from a provider, provisioned by a backend (DOMAIN.md §1.1).
//!
//! Two state machines run side by side. The **chain state** is the lease's standing:
//! `pending → active → closed | expired`, or `pending → rejected`; closed, rejected and expired
//! never revert. The **status** is what the backend is doing with it. A retained lease also
//! carries its **retention** record (`active → restoring → consumed`, `active → reaping →
//! deleted`), and a lease being restored or updated carries a pending **maintenance**
//! `(maintenance_id, admitted_at)` that only an exactly matching completion settles.
//!
//! "live" below means provisioning, ready, failing, failed, restarting or updating; "gone"
//! means deprovisioning, deprovisioned or retained. A command on a lease that does not exist
//! (other than a request or a restore) is `NotFound`. A command the table does not list for a
//! status is `InvalidState`.
//!
//! Every piece of backend work has an **operation id**: a provision and a restore name theirs,
//! a restart or update uses its maintenance id. The lease's current operation is the last one
//! started. Each report (ReportProvisioned, ReportFailed, ReportContainerDied) names the
//! operation it reports on, and on a live lease one naming another than the current operation
//! is `Fenced` before any row below applies: a superseded operation's report never settles a
//! newer one, and the rows' "duplicate report" no-ops only ever see redeliveries within one
//! operation. On a gone lease late reports are ignored, whichever operation they name, and a
//! release confirmation (ConfirmDeprovisioned) is not fenced: a lease being released accepts
//! it whichever callback URL it came on. (A lease started before operations had ids has no
//! current operation and accepts any.)
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | RequestProvision | provisioning | ProvisionRequested | every SKU routes to a backend, else `NoBackend` |
//! | provisioning | RequestProvision | provisioning | — (already in flight) | same provider, items and manifest, else `ProvisionMismatch` (a conflict) |
//! | failing, failed | RequestProvision | provisioning | ProvisionRequested (retry) | chain pending or active, else `InvalidState`; same provider, items and manifest, else `ProvisionMismatch` |
//! | provisioning | ReportProvisioned | ready | Provisioned (+ Activated when pending) | — |
//! | restarting (restore) | ReportProvisioned | ready | Provisioned (+ Activated when pending); linked: FinishRestore(committed) on the source | the source's refusal refuses it |
//! | ready | ReportProvisioned | ready | — (duplicate report) | — |
//! | provisioning, restarting (restore) | ReportFailed | failed | ProvisionFailed (+ Rejected when pending); when restoring, linked: FinishRestore(rolled back) on the source | — |
//! | ready, failing | ReportFailed | failed | Failed | — |
//! | failed | ReportFailed | failed | — (duplicate report) | — |
//! | ready | ReportContainerDied | failing | Failing | — |
//! | failing, failed | ReportContainerDied | unchanged | — (late report) | — |
//! | ready, failing, failed | Restart | restarting | RestartStarted | chain not terminal, else `InvalidState` |
//! | ready, failing, failed | Update | updating | UpdateStarted (a new release) | chain not terminal, else `InvalidState` |
//! | restarting, updating | Restart, Update | unchanged | refused | `InvalidState` (one maintenance at a time) |
//! | restarting, updating | CompleteMaintenance(succeeded) | ready | MaintenanceSucceeded | `(maintenance_id, admitted_at)` equals the pending one (the stamp, issued in whole seconds, compared at whole seconds; a completion without a stamp, from a backend that predates them, matches by the id alone), else `Fenced` |
//! | restarting, updating | CompleteMaintenance(recovered) | ready | MaintenanceRecovered | as above |
//! | restarting, updating | CompleteMaintenance(failed) | failed | MaintenanceFailed | as above |
//! | live | CompleteMaintenance | unchanged | — when nothing is pending and it repeats the last settled completion | otherwise `Fenced` (a stale completion never settles a newer command) |
//! | live | Deprovision | deprovisioning | DeprovisionRequested (+ Closed(tenant) when chain active, + Rejected when pending); when restoring, linked: FinishRestore(rolled back) on the source | — |
//! | gone | Deprovision | unchanged | — (idempotent), or Closed(tenant) / Rejected when the chain was left active / pending | — |
//! | deprovisioning | ConfirmDeprovisioned | deprovisioned or retained | Deprovisioned | — |
//! | deprovisioned, retained | ConfirmDeprovisioned | unchanged | — (duplicate report) | — |
//! | gone | ReportProvisioned, ReportFailed, ReportContainerDied, CompleteMaintenance | unchanged | — (late reports are ignored) | — |
//! | none | Restore | restarting (chain pending) | RestoreStarted; linked: BeginRestore on the source, in the same transaction (so the source is still retained when it commits) | source retained and `active`, same tenant (else `RetainedNotFound`), not restoring or reaping (else `RetainedNotRestorable`), provider matches if given (else `ProviderMismatch`), same services and quantities (else `ItemShapeMismatch`); another SKU tier is the backend's to judge (a demote that does not fit the retained data fails the restore, `DemoteExceedsTier`); stays on the source's backend |
//! | retained (active) | BeginRestore | retained (restoring) | RetentionRestoring | else `RetainedNotRestorable` |
//! | retained (restoring) | FinishRestore(committed) | deprovisioned | RetentionConsumed | the restore named is the one in progress, else `Fenced` |
//! | retained (restoring) | FinishRestore(rolled back) | retained (active) | RetentionRestoreRolledBack | as above |
//! | retained (active) | Reap | retained (reaping) | RetentionReaping | — |
//! | retained (reaping) | Reap | unchanged | — | — |
//! | retained (reaping) | ConfirmReaped | deprovisioned | RetentionDeleted | — |
//! | live | SetCustomDomain | unchanged | CustomDomainSet, or — when the item already has it | chain not terminal; the service names an item (`ItemNotFound`) |
//! | any but none | ObserveTerminalBudget (complete inventory) | unchanged | TerminalBudgetObserved when it changed | — |
//! | failed, chain active | ObserveTerminalBudget(exhausted, ≥ 1 failure, complete) | chain closed, deprovisioning | + ClosedForFailure, DeprovisionRequested | never from `fail_count`; a partial inventory or no budget never closes |
//! | any but none | ObserveTerminalBudget (partial inventory) | unchanged | — | — |
//! | chain active | Close | chain closed | Closed (+ DeprovisionRequested when live; when restoring, linked as for Deprovision) | — |
//! | chain closed | Close | unchanged | — (idempotent), or DeprovisionRequested when still live | — |
//! | chain active | Expire | chain expired | Expired (+ DeprovisionRequested when live) | — |
//! | chain expired | Expire | unchanged | — (idempotent) | — |
//! | any but none | RecordDispatch(any) naming an older generation | unchanged | — (superseded work: its answer changes nothing) | — |
//! | any but none | RecordDispatch(accepted) | unchanged | Dispatched | — |
//! | any but none | RecordDispatch(failed: no answer, a server error, breaker counted) | unchanged | DispatchFailed | — |
//! | provisioning, restarting (restore) | RecordDispatch(refused) | failed | as ReportFailed with the refusal's reason (+ Rejected when pending; linked FinishRestore(rolled back) when restoring) | — |
//! | restarting, updating (maintenance) | RecordDispatch(refused) | failed | MaintenanceFailed with the refusal's reason | — |
//! | any other | RecordDispatch(refused) | unchanged | — (the work was settled otherwise) | — |
//!
//! "linked" commands (see `Aggregate::linked`) are decided on the other lease's stream and
//! appended atomically with this lease's events; a refusal of either refuses both.
//!
//! The **generation** rises with every command that starts backend work (provision, restore,
//! restart, update, deprovision) and is stamped on the events; it never falls. It is also the
//! dispatcher's name for that work: each attempt to hand it to the backend is recorded with
//! its generation (RecordDispatch), and an answer about an older generation changes nothing. `fail_count`
//! counts failures for diagnosis and never decides anything.

mod decide;
mod events;
mod evolve;
mod values;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::StreamId;
use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::workload_quota::{Charge, WorkloadKind};

pub use events::{KIND, LeaseEvent};
pub use values::{LeaseId, LeaseItem, LeaseItems, MaintenanceId, PayloadHash};

// The values every kind shares, re-exported where the lease's callers have always found them.
pub use crate::values::{
    FieldError, HostName, OperationId, OperatorDetail, Problem, ProviderId, Reason, ServiceName,
    Sku, TenantMessage,
};

/// The name of a provisioning backend a lease is placed on.
pub type BackendName = ServiceName;

/// What the backend is doing with the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStatus {
    /// No lease yet: the stream is empty.
    None,
    /// Being provisioned.
    Provisioning,
    /// Running.
    Ready,
    /// A container died; diagnostics are being gathered.
    Failing,
    /// Not running, with a reason.
    Failed,
    /// Being restarted, or restored from retained data.
    Restarting,
    /// Being moved to a new manifest.
    Updating,
    /// Being released.
    Deprovisioning,
    /// Released; nothing is kept.
    Deprovisioned,
    /// Released; its data is kept for a restore.
    Retained,
}

impl LeaseStatus {
    /// Whether the backend still holds compute for it.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Self::Provisioning
                | Self::Ready
                | Self::Failing
                | Self::Failed
                | Self::Restarting
                | Self::Updating
        )
    }

    /// Whether it is released or being released.
    pub fn is_gone(self) -> bool {
        matches!(self, Self::Deprovisioning | Self::Deprovisioned | Self::Retained)
    }

    /// Every status.
    pub const ALL: [Self; 10] = [
        Self::None,
        Self::Provisioning,
        Self::Ready,
        Self::Failing,
        Self::Failed,
        Self::Restarting,
        Self::Updating,
        Self::Deprovisioning,
        Self::Deprovisioned,
        Self::Retained,
    ];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Provisioning => "provisioning",
            Self::Ready => "ready",
            Self::Failing => "failing",
            Self::Failed => "failed",
            Self::Restarting => "restarting",
            Self::Updating => "updating",
            Self::Deprovisioning => "deprovisioning",
            Self::Deprovisioned => "deprovisioned",
            Self::Retained => "retained",
        }
    }

    /// The status named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.name() == name)
    }
}

/// The lease's standing on the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainState {
    /// Requested, not yet acknowledged.
    Pending,
    /// Acknowledged and running its term.
    Active,
    /// Closed (by the tenant, for credit, or for failure). Terminal.
    Closed,
    /// Refused before it started. Terminal.
    Rejected,
    /// Its term ran out. Terminal.
    Expired,
}

impl ChainState {
    /// Whether the chain state can no longer change.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Closed | Self::Rejected | Self::Expired)
    }

    /// Every chain state.
    pub const ALL: [Self; 5] =
        [Self::Pending, Self::Active, Self::Closed, Self::Rejected, Self::Expired];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Active => "active",
            Self::Closed => "closed",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }

    /// The chain state named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|chain| chain.name() == name)
    }
}

/// Why the chain closed a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseCause {
    /// The tenant closed it.
    Tenant,
    /// The tenant's credit ran out.
    CreditDepleted,
    /// An operator closed it.
    Operator,
}

/// Why retained data is destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReapCause {
    /// The grace period (`created_at + retention_max_age`) ran out.
    GraceExpired,
    /// The tenant's cap on retained leases evicted the oldest.
    TenantCapEvicted,
}

/// The backend's verdict on a lease's consecutive-failure budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalVerdict {
    /// Failures may still be retried.
    Available,
    /// No retries are left: the lease may be closed for failure.
    Exhausted,
}

/// The budget last read from a complete inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalBudget {
    /// The verdict.
    pub verdict: TerminalVerdict,
    /// Failures in a row.
    pub consecutive_failures: u32,
}

/// The kind of a pending maintenance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaintenanceKind {
    /// Restart without changing the manifest.
    Restart,
    /// Move to a new manifest (a new release).
    Update,
}

/// A restart or update the backend is carrying out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maintenance {
    /// Which command.
    pub id: MaintenanceId,
    /// When it was admitted; with the id, the fence a completion must match.
    pub admitted_at: DateTime<Utc>,
    /// Restart or update.
    pub kind: MaintenanceKind,
}

/// Where a retained record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetentionStatus {
    /// Available for a restore.
    Active,
    /// Being restored into another lease.
    Restoring {
        /// The lease restoring it.
        into: LeaseId,
    },
    /// Being destroyed; it still counts toward disk usage and cannot be restored.
    Reaping,
}

/// The RetainedLease record: a released lease's data kept for a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Where it stands.
    pub status: RetentionStatus,
    /// When the grace period ends, if retention has a maximum age.
    pub retained_until: Option<DateTime<Utc>>,
}

/// What the lease is for: set by its request (or restore) and kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTerms {
    /// The lease.
    pub id: LeaseId,
    /// Who rents it out.
    pub provider: ProviderId,
    /// What is rented, with each item's custom domain.
    pub items: LeaseItems,
    /// The current manifest's hash (none for a restored lease until it is updated).
    pub payload_hash: Option<PayloadHash>,
    /// Where it is placed.
    pub backend: BackendName,
    /// When it was first requested.
    pub created_at: DateTime<Utc>,
    /// The retained lease it was restored from.
    pub restored_from: Option<LeaseId>,
}

/// The lease aggregate's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// Set by the first event.
    pub terms: Option<LeaseTerms>,
    /// What the backend is doing.
    pub status: LeaseStatus,
    /// The chain's standing.
    pub chain: ChainState,
    /// The tenant-safe reason of the last failure.
    pub reason: Option<Reason>,
    /// The tenant-safe message of the last failure.
    pub message: Option<TenantMessage>,
    /// The operator-only detail of the last failure.
    pub last_error: Option<OperatorDetail>,
    /// Failures recorded over the lease's life (diagnostic only).
    pub fail_count: u32,
    /// Rises with every command that starts backend work.
    pub generation: u64,
    /// The backend work whose reports are accepted now: the last provision, restore, restart
    /// or update started (`None` for a lease started before operations had ids).
    pub operation: Option<OperationId>,
    /// The restart or update in progress.
    pub pending: Option<Maintenance>,
    /// The last completion that settled a maintenance, so that a repeated report is a no-op.
    pub last_settled: Option<(MaintenanceId, DateTime<Utc>)>,
    /// The retained record, while retained.
    pub retention: Option<Retention>,
    /// The failure budget from the last complete inventory.
    pub terminal_budget: Option<TerminalBudget>,
    /// Releases so far (each provision and update is one).
    pub release_count: u32,
    /// The release running, if any.
    pub active_release: Option<u32>,
    /// The release being deployed, if any.
    pub deploying_release: Option<u32>,
    /// When the last event happened.
    pub updated_at: Option<DateTime<Utc>>,
}

/// The outcome a backend reports for a restart or update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaintenanceOutcome {
    /// It completed.
    Succeeded,
    /// It failed and the backend rolled back to what ran before.
    Recovered {
        /// Tenant-safe reason.
        reason: Reason,
        /// Tenant-safe message.
        message: TenantMessage,
        /// Operator-only detail.
        detail: OperatorDetail,
    },
    /// It failed and left the lease failed.
    Failed {
        /// Tenant-safe reason.
        reason: Reason,
        /// Tenant-safe message.
        message: TenantMessage,
        /// Operator-only detail.
        detail: OperatorDetail,
    },
}

/// What can be asked of a lease. Serialized only to hash a request for the idempotency ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseCommand {
    /// Provision the lease (a tenant; also a retry after a failure).
    RequestProvision {
        /// The lease's id (the stream's).
        lease: LeaseId,
        /// Who rents it out.
        provider: ProviderId,
        /// What to rent.
        items: LeaseItems,
        /// The manifest's hash.
        payload_hash: PayloadHash,
        /// The id the backend's reports on this provision will name.
        operation: OperationId,
    },
    /// The backend finished provisioning (or restoring).
    ReportProvisioned {
        /// The operation it settles.
        operation: OperationId,
    },
    /// The backend failed to provision, or a running lease failed, with its diagnosis.
    ReportFailed {
        /// The operation it reports on.
        operation: OperationId,
        /// Tenant-safe reason.
        reason: Reason,
        /// Tenant-safe message.
        message: TenantMessage,
        /// Operator-only detail.
        detail: OperatorDetail,
    },
    /// A running lease's container exited.
    ReportContainerDied {
        /// The operation it reports on.
        operation: OperationId,
        /// Operator-only detail.
        detail: OperatorDetail,
    },
    /// Restart the lease's containers (a tenant).
    Restart {
        /// The command's id; completions must name it.
        maintenance_id: MaintenanceId,
    },
    /// Move the lease to a new manifest (a tenant).
    Update {
        /// The command's id; completions must name it.
        maintenance_id: MaintenanceId,
        /// The new manifest's hash.
        payload_hash: PayloadHash,
    },
    /// The backend's completion of a restart or update.
    CompleteMaintenance {
        /// The command completed.
        maintenance_id: MaintenanceId,
        /// Its admission stamp, as the backend echoes it; `None` from a backend that predates
        /// stamps, whose completion is settled by the maintenance id alone.
        admitted_at: Option<DateTime<Utc>>,
        /// How it went.
        outcome: MaintenanceOutcome,
    },
    /// Release the lease's resources (a tenant or an operator). Idempotent.
    Deprovision,
    /// The backend released them, keeping the data or not.
    ConfirmDeprovisioned {
        /// Whether the volumes were kept for a restore.
        retained: bool,
    },
    /// Start this new lease from another lease's retained data (a tenant).
    Restore {
        /// The new lease's id.
        lease: LeaseId,
        /// The retained lease.
        from: LeaseId,
        /// The provider the tenant expects the retained lease to have, if it names one.
        provider: Option<ProviderId>,
        /// The items, which must keep the retained lease's shape.
        items: LeaseItems,
        /// The id the backend's reports on this restore will name.
        operation: OperationId,
    },
    /// On the retained lease: a restore into `into` begins.
    BeginRestore {
        /// The lease being restored.
        into: LeaseId,
    },
    /// On the retained lease: the restore into `into` committed or rolled back.
    FinishRestore {
        /// The lease being restored.
        into: LeaseId,
        /// Whether the restore committed.
        committed: bool,
    },
    /// Destroy the retained data.
    Reap {
        /// Why.
        cause: ReapCause,
    },
    /// Every retained volume is confirmed destroyed.
    ConfirmReaped,
    /// Route a host name to one item, or remove it (`None`). Idempotent.
    SetCustomDomain {
        /// The item's service; `None` for a lease of one item.
        service: Option<ServiceName>,
        /// The host name.
        domain: Option<HostName>,
    },
    /// The backend's failure budget, as an inventory read reports it.
    ObserveTerminalBudget {
        /// The verdict.
        verdict: TerminalVerdict,
        /// Failures in a row.
        consecutive_failures: u32,
        /// Whether it was read from a complete, identity-bearing inventory.
        complete_inventory: bool,
    },
    /// Close the lease on the chain.
    Close {
        /// Why.
        cause: CloseCause,
    },
    /// The lease's term ran out.
    Expire,
    /// The dispatcher's record of one attempt to hand backend work to the lease's backend.
    RecordDispatch {
        /// The generation of the work (the one its starting event was stamped with).
        generation: u64,
        /// Which attempt, from 1.
        attempt: u32,
        /// What the backend answered.
        answer: DispatchAnswer,
    },
}

/// What a backend answered one dispatch attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DispatchAnswer {
    /// It took the work (`202`, or `200` for a release); its callback settles it.
    Accepted,
    /// No usable answer (unreachable, timed out, a server error, a malformed body): the work
    /// is tried again later.
    Failed {
        /// Operator-only detail.
        detail: OperatorDetail,
    },
    /// It refused the work for good: the work fails with this reason.
    Refused {
        /// Tenant-safe reason.
        reason: Reason,
        /// Tenant-safe message.
        message: TenantMessage,
        /// Operator-only detail.
        detail: OperatorDetail,
    },
}

impl LeaseCommand {
    /// The operation a backend's report names, which must be the lease's current one; `None`
    /// for commands that are not fenced by an operation.
    pub fn reported_operation(&self) -> Option<OperationId> {
        match self {
            Self::ReportProvisioned { operation }
            | Self::ReportFailed { operation, .. }
            | Self::ReportContainerDied { operation, .. } => Some(*operation),
            _ => None,
        }
    }

    /// The command's name, for refusals.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RequestProvision { .. } => "RequestProvision",
            Self::ReportProvisioned { .. } => "ReportProvisioned",
            Self::ReportFailed { .. } => "ReportFailed",
            Self::ReportContainerDied { .. } => "ReportContainerDied",
            Self::Restart { .. } => "Restart",
            Self::Update { .. } => "Update",
            Self::CompleteMaintenance { .. } => "CompleteMaintenance",
            Self::Deprovision => "Deprovision",
            Self::ConfirmDeprovisioned { .. } => "ConfirmDeprovisioned",
            Self::Restore { .. } => "Restore",
            Self::BeginRestore { .. } => "BeginRestore",
            Self::FinishRestore { .. } => "FinishRestore",
            Self::Reap { .. } => "Reap",
            Self::ConfirmReaped => "ConfirmReaped",
            Self::SetCustomDomain { .. } => "SetCustomDomain",
            Self::ObserveTerminalBudget { .. } => "ObserveTerminalBudget",
            Self::Close { .. } => "Close",
            Self::Expire => "Expire",
            Self::RecordDispatch { .. } => "RecordDispatch",
        }
    }
}

/// The retained lease a restore starts from, as looked up for the tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct RetainedSource {
    /// Whether it belongs to the commanding tenant.
    pub same_tenant: bool,
    /// The retained lease's state.
    pub lease: Lease,
}

/// Facts a lease command is decided with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseFacts {
    /// The backend every SKU of a provision request routes to, if one does.
    pub backend: Option<BackendName>,
    /// For a restore: the retained lease named, if it exists.
    pub retained_source: Option<RetainedSource>,
    /// How long retained data is kept after the lease was created, if there is a limit.
    pub retention_max_age: Option<TimeDelta>,
}

/// Why a lease command is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The lease does not exist (for this tenant).
    #[error("lease not found")]
    NotFound,
    /// The command is not allowed in the lease's current state.
    #[error("{command} is not allowed while the lease is {status:?} (chain {chain:?})")]
    InvalidState {
        /// The refused command.
        command: &'static str,
        /// The lease's status.
        status: LeaseStatus,
        /// The lease's chain state.
        chain: ChainState,
    },
    /// A completion or restore report that does not match what is pending.
    #[error("the report does not match the pending command")]
    Fenced,
    /// No backend serves one of the requested SKUs.
    #[error("no backend serves SKU {sku}")]
    NoBackend {
        /// The first SKU without a backend.
        sku: Sku,
    },
    /// A provision retry named other terms than the lease's.
    #[error("a provision retry must repeat the lease's provider, items and manifest")]
    ProvisionMismatch,
    /// The named retained lease does not exist for this tenant.
    #[error("no retained lease with that id")]
    RetainedNotFound,
    /// The retained lease is being restored or reaped.
    #[error("the retained lease cannot be restored now")]
    RetainedNotRestorable,
    /// The provider named differs from the retained lease's.
    #[error("the retained lease belongs to another provider")]
    ProviderMismatch,
    /// The items do not keep the retained lease's services and quantities.
    #[error("the items must keep the retained lease's services and quantities")]
    ItemShapeMismatch,
    /// No item of the lease has that service.
    #[error("the lease has no item {service:?}")]
    ItemNotFound {
        /// The service named (`None`: the lease has several items and none was named).
        service: Option<ServiceName>,
    },
}

impl Refusal for LeaseError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound | Self::RetainedNotFound => RefusalKind::NotFound,
            Self::InvalidState { .. } | Self::RetainedNotRestorable => RefusalKind::InvalidState,
            Self::Fenced => RefusalKind::Fenced,
            Self::NoBackend { .. } | Self::ItemNotFound { .. } => RefusalKind::BadInput,
            Self::ProvisionMismatch | Self::ProviderMismatch | Self::ItemShapeMismatch => {
                RefusalKind::Conflict
            }
        }
    }
}

impl Aggregate for Lease {
    const STREAM_TYPE: &'static str = KIND.stream_type;
    const STATE_SCHEMA: u32 = 2;
    type Command = LeaseCommand;
    type Event = LeaseEvent;
    type Error = LeaseError;
    type Facts = LeaseFacts;
    const WORKLOAD: Option<WorkloadKind> = Some(WorkloadKind::Lease);

    /// A lease holds its items' SKUs (`sku.<SKU>`) while the backend holds compute for it:
    /// while live, and while being released until the release is confirmed (rule 9).
    fn charge(&self) -> Option<Charge> {
        let holds = self.status.is_live() || self.status == LeaseStatus::Deprovisioning;
        let terms = self.terms.as_ref().filter(|_| holds)?;
        let items = terms.items.as_slice().iter();
        Some(Charge::of(items.map(|item| (format!("sku.{}", item.sku), u64::from(item.quantity)))))
    }

    fn initial() -> Self {
        Self {
            terms: None,
            status: LeaseStatus::None,
            chain: ChainState::Pending,
            reason: None,
            message: None,
            last_error: None,
            fail_count: 0,
            generation: 0,
            operation: None,
            pending: None,
            last_settled: None,
            retention: None,
            terminal_budget: None,
            release_count: 0,
            active_release: None,
            deploying_release: None,
            updated_at: None,
        }
    }

    fn decide(
        &self,
        command: &LeaseCommand,
        ctx: &Context<LeaseFacts>,
    ) -> Result<Vec<LeaseEvent>, LeaseError> {
        decide::decide(self, command, ctx)
    }

    fn evolve(self, event: &LeaseEvent) -> Self {
        evolve::evolve(self, event)
    }

    /// Released with nothing kept, and closed for good on the chain or never acknowledged:
    /// no command changes it any more.
    fn is_terminal(&self) -> bool {
        self.status == LeaseStatus::Deprovisioned && self.chain != ChainState::Active
    }

    /// A restore moves the source's retained record with it: starting it marks the record
    /// `restoring`, and the new lease's first report (provisioned or failed) consumes the
    /// record or makes it available again, in the same transaction.
    fn linked(
        &self,
        command: &LeaseCommand,
        events: &[LeaseEvent],
    ) -> Vec<(StreamId, LeaseCommand)> {
        let restoring = self.status == LeaseStatus::Restarting && self.pending.is_none();
        let source =
            self.terms.as_ref().and_then(|terms| terms.restored_from.map(|from| (terms.id, from)));
        match (command, events.first(), source) {
            (
                LeaseCommand::Restore { lease, from, .. },
                Some(LeaseEvent::LeaseRestoreStarted { .. }),
                _,
            ) => {
                vec![(from.stream_id(), LeaseCommand::BeginRestore { into: *lease })]
            }
            (
                LeaseCommand::ReportProvisioned { .. }
                | LeaseCommand::ReportFailed { .. }
                | LeaseCommand::RecordDispatch { .. },
                Some(
                    first @ (LeaseEvent::LeaseProvisioned { .. }
                    | LeaseEvent::LeaseProvisionFailed { .. }),
                ),
                Some((into, from)),
            ) if restoring => {
                let committed = matches!(first, LeaseEvent::LeaseProvisioned { .. });
                vec![(from.stream_id(), LeaseCommand::FinishRestore { into, committed })]
            }
            // Released while restoring: the restore never completed, so the source's record
            // is available again rather than left `restoring` for ever.
            (LeaseCommand::Deprovision | LeaseCommand::Close { .. }, _, Some((into, from)))
                if restoring
                    && events.iter().any(|event| {
                        matches!(event, LeaseEvent::LeaseDeprovisionRequested { .. })
                    }) =>
            {
                vec![(from.stream_id(), LeaseCommand::FinishRestore { into, committed: false })]
            }
            _ => Vec::new(),
        }
    }

    fn is_creation(command: &LeaseCommand) -> bool {
        matches!(command, LeaseCommand::RequestProvision { .. } | LeaseCommand::Restore { .. })
    }

    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }
}
