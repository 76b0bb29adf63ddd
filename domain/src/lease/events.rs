//! The lease's stored events. Names are past tense and stable once shipped; each payload is
//! the variant's fields as JSON. The manifest never enters an event (only its hash); what a
//! tenant sees of each event is declared in [`KIND`], leaf by leaf.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::values::{LeaseId, LeaseItems, MaintenanceId, PayloadHash};
use super::{BackendName, CloseCause, ReapCause, TerminalVerdict};
use crate::registry::{AggregateKind, EventView};
use crate::values::{
    HostName, OperationId, OperatorDetail, ProviderId, Reason, ServiceName, TenantMessage,
};

/// Everything that can happen to a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum LeaseEvent {
    /// A tenant asked for the lease to be provisioned (first time or a retry after failure).
    LeaseProvisionRequested {
        lease: LeaseId,
        provider: ProviderId,
        items: LeaseItems,
        payload_hash: PayloadHash,
        backend: BackendName,
        generation: u64,
        release: u32,
        at: DateTime<Utc>,
        /// Absent in events recorded before operations had ids.
        #[serde(default)]
        operation: Option<OperationId>,
    },
    /// The backend reported the provision (or restore) done.
    LeaseProvisioned { release: Option<u32>, at: DateTime<Utc> },
    /// The chain acknowledged the lease: PENDING became ACTIVE.
    LeaseActivated { at: DateTime<Utc> },
    /// The backend reported the provision (or restore) failed.
    LeaseProvisionFailed {
        reason: Reason,
        message: TenantMessage,
        detail: OperatorDetail,
        release: Option<u32>,
        at: DateTime<Utc>,
    },
    /// The chain rejected the lease: PENDING became REJECTED.
    LeaseRejected { at: DateTime<Utc> },
    /// A running lease's container died; diagnostics are being gathered.
    LeaseFailing { detail: OperatorDetail, at: DateTime<Utc> },
    /// A running lease failed, with its diagnosis.
    LeaseFailed {
        reason: Reason,
        message: TenantMessage,
        detail: OperatorDetail,
        at: DateTime<Utc>,
    },
    /// A restart was admitted.
    LeaseRestartStarted {
        maintenance_id: MaintenanceId,
        admitted_at: DateTime<Utc>,
        generation: u64,
    },
    /// An update to a new manifest was admitted, as a new release.
    LeaseUpdateStarted {
        maintenance_id: MaintenanceId,
        admitted_at: DateTime<Utc>,
        generation: u64,
        payload_hash: PayloadHash,
        release: u32,
    },
    /// The pending restart or update completed.
    LeaseMaintenanceSucceeded {
        maintenance_id: MaintenanceId,
        release: Option<u32>,
        at: DateTime<Utc>,
    },
    /// The pending restart or update failed and the backend rolled back to what ran before.
    LeaseMaintenanceRecovered {
        maintenance_id: MaintenanceId,
        reason: Reason,
        message: TenantMessage,
        detail: OperatorDetail,
        release: Option<u32>,
        at: DateTime<Utc>,
    },
    /// The pending restart or update failed and left the lease failed.
    LeaseMaintenanceFailed {
        maintenance_id: MaintenanceId,
        reason: Reason,
        message: TenantMessage,
        detail: OperatorDetail,
        release: Option<u32>,
        at: DateTime<Utc>,
    },
    /// The lease's resources are to be released.
    LeaseDeprovisionRequested { generation: u64, at: DateTime<Utc> },
    /// The backend released the resources, keeping the data (`retained`) or not.
    LeaseDeprovisioned { retained: bool, retained_until: Option<DateTime<Utc>>, at: DateTime<Utc> },
    /// A new lease started from another lease's retained data.
    LeaseRestoreStarted {
        lease: LeaseId,
        from: LeaseId,
        provider: ProviderId,
        items: LeaseItems,
        backend: BackendName,
        generation: u64,
        at: DateTime<Utc>,
        /// Absent in events recorded before operations had ids.
        #[serde(default)]
        operation: Option<OperationId>,
    },
    /// This lease's retained data is being restored into another lease.
    LeaseRetentionRestoring { into: LeaseId, at: DateTime<Utc> },
    /// The restore into another lease failed; the retained data is available again.
    LeaseRetentionRestoreRolledBack { into: LeaseId, at: DateTime<Utc> },
    /// The restore into another lease committed; the retained record is gone.
    LeaseRetentionConsumed { into: LeaseId, at: DateTime<Utc> },
    /// The retained data is being destroyed (grace expired, or evicted by the tenant's cap).
    LeaseRetentionReaping { cause: ReapCause, at: DateTime<Utc> },
    /// Every retained volume is confirmed destroyed.
    LeaseRetentionDeleted { at: DateTime<Utc> },
    /// The host name routed to one item changed (`None`: removed).
    LeaseCustomDomainSet {
        service: Option<ServiceName>,
        domain: Option<HostName>,
        at: DateTime<Utc>,
    },
    /// The backend's consecutive-failure budget, read from a complete inventory.
    LeaseTerminalBudgetObserved {
        verdict: TerminalVerdict,
        consecutive_failures: u32,
        at: DateTime<Utc>,
    },
    /// The chain closed a failed lease whose failure budget is exhausted.
    LeaseClosedForFailure { consecutive_failures: u32, at: DateTime<Utc> },
    /// The chain closed the lease: ACTIVE became CLOSED.
    LeaseClosed { cause: CloseCause, at: DateTime<Utc> },
    /// The lease ran out its term: ACTIVE became EXPIRED.
    LeaseExpired { at: DateTime<Utc> },
    /// The backend took the work of `generation` (its callback settles it).
    LeaseDispatched { generation: u64, attempt: u32, at: DateTime<Utc> },
    /// An attempt to hand the work of `generation` to the backend got no usable answer; it is
    /// tried again.
    LeaseDispatchFailed { generation: u64, attempt: u32, detail: OperatorDetail, at: DateTime<Utc> },
}

crate::tagged_events!(LeaseEvent {
    LeaseProvisionRequested,
    LeaseProvisioned,
    LeaseActivated,
    LeaseProvisionFailed,
    LeaseRejected,
    LeaseFailing,
    LeaseFailed,
    LeaseRestartStarted,
    LeaseUpdateStarted,
    LeaseMaintenanceSucceeded,
    LeaseMaintenanceRecovered,
    LeaseMaintenanceFailed,
    LeaseDeprovisionRequested,
    LeaseDeprovisioned,
    LeaseRestoreStarted,
    LeaseRetentionRestoring,
    LeaseRetentionRestoreRolledBack,
    LeaseRetentionConsumed,
    LeaseRetentionReaping,
    LeaseRetentionDeleted,
    LeaseCustomDomainSet,
    LeaseTerminalBudgetObserved,
    LeaseClosedForFailure,
    LeaseClosed,
    LeaseExpired,
    LeaseDispatched,
    LeaseDispatchFailed,
});

impl LeaseEvent {
    /// Every event type a lease stream may hold, for projections that subscribe to them.
    pub const TYPES: [&'static str; 27] = [
        "LeaseProvisionRequested",
        "LeaseProvisioned",
        "LeaseActivated",
        "LeaseProvisionFailed",
        "LeaseRejected",
        "LeaseFailing",
        "LeaseFailed",
        "LeaseRestartStarted",
        "LeaseUpdateStarted",
        "LeaseMaintenanceSucceeded",
        "LeaseMaintenanceRecovered",
        "LeaseMaintenanceFailed",
        "LeaseDeprovisionRequested",
        "LeaseDeprovisioned",
        "LeaseRestoreStarted",
        "LeaseRetentionRestoring",
        "LeaseRetentionRestoreRolledBack",
        "LeaseRetentionConsumed",
        "LeaseRetentionReaping",
        "LeaseRetentionDeleted",
        "LeaseCustomDomainSet",
        "LeaseTerminalBudgetObserved",
        "LeaseClosedForFailure",
        "LeaseClosed",
        "LeaseExpired",
        "LeaseDispatched",
        "LeaseDispatchFailed",
    ];
}

/// The lease kind, and what a tenant may see of each of its events (DOMAIN.md §3, rules 3
/// and 4: failure detail, the lifecycle generation, the operation a backend reports against
/// and the terminal failure budget are for operators and auditors only).
pub const KIND: AggregateKind = AggregateKind { stream_type: "lease", events: &VIEWS };

const AT: &[&str] = &["at"];

const VIEWS: [EventView; 27] = [
    view(
        "LeaseProvisionRequested",
        &[
            "lease",
            "provider",
            "items[].sku",
            "items[].quantity",
            "items[].service_name",
            "items[].custom_domain",
            "payload_hash",
            "backend",
            "release",
            "at",
        ],
        &["generation", "operation"],
    ),
    view("LeaseProvisioned", &["release", "at"], &[]),
    view("LeaseActivated", AT, &[]),
    view("LeaseProvisionFailed", &["reason", "message", "release", "at"], &["detail"]),
    view("LeaseRejected", AT, &[]),
    view("LeaseFailing", AT, &["detail"]),
    view("LeaseFailed", &["reason", "message", "at"], &["detail"]),
    view("LeaseRestartStarted", &["maintenance_id", "admitted_at"], &["generation"]),
    view(
        "LeaseUpdateStarted",
        &["maintenance_id", "admitted_at", "payload_hash", "release"],
        &["generation"],
    ),
    view("LeaseMaintenanceSucceeded", &["maintenance_id", "release", "at"], &[]),
    view(
        "LeaseMaintenanceRecovered",
        &["maintenance_id", "reason", "message", "release", "at"],
        &["detail"],
    ),
    view(
        "LeaseMaintenanceFailed",
        &["maintenance_id", "reason", "message", "release", "at"],
        &["detail"],
    ),
    view("LeaseDeprovisionRequested", AT, &["generation"]),
    view("LeaseDeprovisioned", &["retained", "retained_until", "at"], &[]),
    view(
        "LeaseRestoreStarted",
        &[
            "lease",
            "from",
            "provider",
            "items[].sku",
            "items[].quantity",
            "items[].service_name",
            "items[].custom_domain",
            "backend",
            "at",
        ],
        &["generation", "operation"],
    ),
    view("LeaseRetentionRestoring", &["into", "at"], &[]),
    view("LeaseRetentionRestoreRolledBack", &["into", "at"], &[]),
    view("LeaseRetentionConsumed", &["into", "at"], &[]),
    view("LeaseRetentionReaping", &["cause", "at"], &[]),
    view("LeaseRetentionDeleted", AT, &[]),
    view("LeaseCustomDomainSet", &["service", "domain", "at"], &[]),
    view("LeaseTerminalBudgetObserved", AT, &["verdict", "consecutive_failures"]),
    view("LeaseClosedForFailure", AT, &["consecutive_failures"]),
    view("LeaseClosed", &["cause", "at"], &[]),
    view("LeaseExpired", AT, &[]),
    view("LeaseDispatched", &["attempt", "at"], &["generation"]),
    view("LeaseDispatchFailed", &["attempt", "at"], &["generation", "detail"]),
];

const fn view(
    event_type: &'static str,
    tenant_fields: &'static [&'static str],
    withheld: &'static [&'static str],
) -> EventView {
    EventView { event_type, tenant_fields, withheld }
}
