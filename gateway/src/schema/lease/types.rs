//! Leases as tenants see them: the tenant-safe columns of the `leases` read model, never the
//! last error, the generation or the tenant id.

use async_graphql::{Enum, ID, InputObject, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{LeaseSummary, QuotaUsage};
use leasehold_commands::lease_service::CurrentWork;
use leasehold_domain::lease::{self as domain, LeaseItem};

/// What the backend is doing with a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum LeaseStatus {
    /// Being provisioned.
    Provisioning,
    /// Running.
    Ready,
    /// A container died; diagnostics are being gathered.
    Failing,
    /// Not running; `reason` and `message` say why.
    Failed,
    /// Being restarted, or restored from retained data.
    Restarting,
    /// Being moved to a new manifest.
    Updating,
    /// Being released.
    Deprovisioning,
    /// Released; nothing is kept.
    Deprovisioned,
    /// Released, its data kept for a restore.
    Retained,
    /// A safety value the normal flow never reaches.
    Unknown,
}

impl LeaseStatus {
    /// The domain's status this one shows (`None` for `Unknown`).
    pub fn domain(self) -> Option<domain::LeaseStatus> {
        use domain::LeaseStatus as D;
        Some(match self {
            Self::Provisioning => D::Provisioning,
            Self::Ready => D::Ready,
            Self::Failing => D::Failing,
            Self::Failed => D::Failed,
            Self::Restarting => D::Restarting,
            Self::Updating => D::Updating,
            Self::Deprovisioning => D::Deprovisioning,
            Self::Deprovisioned => D::Deprovisioned,
            Self::Retained => D::Retained,
            Self::Unknown => return None,
        })
    }

    /// The status a read model stores as `name` (its spelling is the domain's).
    fn of_name(name: &str) -> Self {
        domain::LeaseStatus::from_name(name).map_or(Self::Unknown, Self::of_domain)
    }

    /// The domain's status as shown.
    pub(crate) fn of_domain(status: domain::LeaseStatus) -> Self {
        use domain::LeaseStatus as D;
        match status {
            D::Provisioning => Self::Provisioning,
            D::Ready => Self::Ready,
            D::Failing => Self::Failing,
            D::Failed => Self::Failed,
            D::Restarting => Self::Restarting,
            D::Updating => Self::Updating,
            D::Deprovisioning => Self::Deprovisioning,
            D::Deprovisioned => Self::Deprovisioned,
            D::Retained => Self::Retained,
            D::None => Self::Unknown,
        }
    }
}

/// The lease's standing on the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum ChainState {
    /// Requested, not yet acknowledged.
    Pending,
    /// Acknowledged and running its term.
    Active,
    /// Closed. Terminal.
    Closed,
    /// Refused before it started. Terminal.
    Rejected,
    /// Its term ran out. Terminal.
    Expired,
}

impl ChainState {
    /// The chain state a read model stores as `name` (its spelling is the domain's).
    fn of_name(name: &str) -> Self {
        use domain::ChainState as D;
        match D::from_name(name) {
            Some(D::Active) => Self::Active,
            Some(D::Closed) => Self::Closed,
            Some(D::Rejected) => Self::Rejected,
            Some(D::Expired) => Self::Expired,
            Some(D::Pending) | None => Self::Pending,
        }
    }
}

/// One rented item.
#[derive(Debug, Clone, SimpleObject)]
pub struct LeaseItemView {
    /// What is rented.
    pub sku: String,
    /// How many.
    pub quantity: u32,
    /// The service, for stack leases.
    pub service_name: Option<String>,
    /// The host name routed to it.
    pub custom_domain: Option<String>,
}

impl From<&LeaseItem> for LeaseItemView {
    fn from(item: &LeaseItem) -> Self {
        Self {
            sku: item.sku.as_str().to_string(),
            quantity: item.quantity,
            service_name: item.service_name.as_ref().map(|name| name.as_str().to_string()),
            custom_domain: item.custom_domain.as_ref().map(|host| host.as_str().to_string()),
        }
    }
}

/// A lease, as its tenant sees it.
#[derive(Debug, Clone, SimpleObject)]
#[graphql(name = "Lease")]
pub struct LeaseView {
    /// The lease's id.
    pub id: ID,
    /// Who rents it out.
    pub provider_id: ID,
    /// What the backend is doing.
    pub status: LeaseStatus,
    /// The chain's standing.
    pub chain_state: ChainState,
    /// Why it last failed (an open set; `Unknown` when none was given).
    pub reason: Option<String>,
    /// What to tell the tenant about the last failure.
    pub message: Option<String>,
    /// What is rented.
    pub items: Vec<LeaseItemView>,
    /// Failures over the lease's life (diagnostic only).
    pub fail_count: u32,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Until when its data is kept, while retained.
    pub retained_until: Option<DateTime<Utc>>,
    /// The retained lease it was restored from.
    pub restored_from: Option<ID>,
}

impl From<LeaseSummary> for LeaseView {
    fn from(lease: LeaseSummary) -> Self {
        Self {
            id: ID(lease.lease_id.0.to_string()),
            provider_id: ID(lease.provider_id.to_string()),
            status: LeaseStatus::of_name(&lease.status),
            chain_state: ChainState::of_name(&lease.chain_state),
            reason: lease.reason,
            message: lease.message,
            items: lease.items.iter().map(LeaseItemView::from).collect(),
            fail_count: lease.fail_count,
            created_at: lease.created_at,
            updated_at: lease.updated_at,
            retained_until: lease.retained_until,
            restored_from: lease.restored_from.map(|id| ID(id.to_string())),
        }
    }
}

/// One release of a lease: each provision and update is one (the manifest itself is never
/// stored; its hash is).
#[derive(Debug, Clone, SimpleObject)]
#[graphql(name = "LeaseRelease")]
pub struct ReleaseView {
    /// From 1, rising.
    pub version: u32,
    /// The SHA-256 of the release's manifest.
    pub payload_hash: String,
    /// `deploying`, `active`, `superseded` or `failed`.
    pub status: String,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    /// What to tell the tenant about it.
    pub message: Option<String>,
    /// When it was started.
    pub created_at: DateTime<Utc>,
    /// Its image, as the lease's backend reports it (`GET /releases`); null when the backend
    /// did not answer in time or does not know the release.
    pub image: Option<String>,
}

impl From<leasehold_adapters::read_models::Release> for ReleaseView {
    fn from(release: leasehold_adapters::read_models::Release) -> Self {
        Self {
            version: release.version,
            payload_hash: release.payload_hash,
            status: release.status,
            reason: release.reason,
            message: release.message,
            created_at: release.created_at,
            image: None,
        }
    }
}

/// What a lease's backend is carrying out now, as agents and operators see it.
#[derive(Debug, Clone, SimpleObject)]
pub struct LeaseWork {
    /// The lease.
    pub lease_id: ID,
    /// What the backend is doing.
    pub status: LeaseStatus,
    /// The operation reports must name (`reportLeaseProvisioned`, `reportLeaseFailed`); null
    /// for a lease started before operations had ids.
    pub operation_id: Option<ID>,
    /// The path a backend's callbacks for it go to (sign it as `X-Leasehold-Signature` says).
    pub callback_path: Option<String>,
    /// The pending restart or update, whose completion must echo it with `admittedAt`.
    pub maintenance_id: Option<ID>,
    /// When the pending restart or update was admitted.
    pub admitted_at: Option<DateTime<Utc>>,
}

impl From<CurrentWork> for LeaseWork {
    fn from(work: CurrentWork) -> Self {
        let lease = work.lease.0;
        let callback_path = match (work.maintenance, work.operation) {
            (Some((maintenance, _)), _) => {
                Some(format!("/callbacks/leases/{lease}/maintenance/{maintenance}"))
            }
            (None, Some(operation)) => {
                Some(format!("/callbacks/leases/{lease}/operations/{operation}"))
            }
            (None, None) => None,
        };
        Self {
            lease_id: ID(lease.to_string()),
            status: LeaseStatus::of_domain(work.status),
            operation_id: work.operation.map(|operation| ID(operation.to_string())),
            callback_path,
            maintenance_id: work.maintenance.map(|(id, _)| ID(id.to_string())),
            admitted_at: work.maintenance.map(|(_, at)| at),
        }
    }
}

/// Which leases to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct LeaseFilter {
    /// Only leases with this status.
    pub status: Option<LeaseStatus>,
}

/// Quantity held of one SKU.
#[derive(Debug, Clone, SimpleObject)]
pub struct SkuUsage {
    /// The SKU.
    pub sku: String,
    /// Quantity held by workloads that hold resources.
    pub quantity: u64,
}

/// The tenant's usage of one kind of workload.
#[derive(Debug, Clone, SimpleObject)]
#[graphql(name = "QuotaUsage")]
pub struct QuotaUsageView {
    /// The workload kind (`lease`, ...).
    pub kind: String,
    /// Workloads holding resources.
    pub active_count: u64,
    /// Quantities held, by SKU.
    pub skus: Vec<SkuUsage>,
    /// Snapshots (`kind` `snapshot`, whose `activeCount` is the snapshots counted): their
    /// bytes.
    pub bytes: Option<u64>,
    /// Snapshots: the most your quota allows (0: no limit).
    pub max_count: Option<u64>,
    /// Snapshots: the most bytes your quota allows (0: no limit).
    pub max_bytes: Option<u64>,
    /// Each limit an operator set on this kind (as events: `setSnapshotQuota`,
    /// `setRunnerLimits`), beside what is used against it; empty where none is set.
    pub limits: Vec<QuotaLimitView>,
}

/// One limit beside its usage.
#[derive(Debug, Clone, SimpleObject)]
#[graphql(name = "QuotaLimit")]
pub struct QuotaLimitView {
    /// What it limits (`runner.vcpu`, `runner.memory_mb`, `runner.macos`,
    /// `runner.tier.<tier>`, `snapshot.count`, `snapshot.bytes`).
    pub resource: String,
    /// What is used against it now.
    pub used: u64,
    /// The most allowed (0: no limit).
    pub max: u64,
}

impl From<QuotaUsage> for QuotaUsageView {
    fn from(usage: QuotaUsage) -> Self {
        let skus = usage.skus.into_iter().map(|(sku, quantity)| SkuUsage { sku, quantity });
        let limits = usage.snapshot;
        Self {
            kind: usage.kind,
            active_count: usage.active_count,
            skus: skus.collect(),
            bytes: limits.map(|limits| limits.bytes),
            max_count: limits.map(|limits| limits.max_count),
            max_bytes: limits.map(|limits| limits.max_bytes),
            limits: usage
                .limits
                .into_iter()
                .map(|limit| QuotaLimitView {
                    resource: limit.resource,
                    used: limit.used,
                    max: limit.max,
                })
                .collect(),
        }
    }
}
