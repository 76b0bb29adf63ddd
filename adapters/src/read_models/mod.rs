//! Queries over the read models. Every tenant query takes the tenant from the caller (the
//! verified token) and filters by it in SQL: another tenant's row is simply not found. Tenant
//! queries select only tenant-safe columns; operator-only data has its own queries.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use leasehold_domain::lease::{LeaseId, LeaseItem};
use leasehold_domain::{Cursor, StoreError, TenantId};
use tokio_postgres::Row;
use uuid::Uuid;

use deadpool_postgres::Pool;

use crate::store::{PgEventStore, cursor_of, from_driver, from_pool};

mod artifacts;
mod as_of;
mod fleet;
mod rented;
mod runner_views;
mod runners;
mod snapshots;
mod workload_quotas;
mod workloads;

pub use artifacts::LayerHit;
pub use as_of::Entity;
pub use fleet::{DeadLetter, HostSummary, VmListing, VmSummary};
pub use rented::{LifetimePassed, NodeSummary, RentalSummary, RentedListing, RunSummary, Scope};
pub use runner_views::{HoldFacts, JobSummary, RunnerLeaseSummary, RunnerUsageRow};
pub use runners::RunnerHold;
pub use snapshots::{SnapshotPage, SnapshotQuotaUsage, SnapshotSummary};

pub use workloads::{WorkloadItem, WorkloadListing, WorkloadSummary};

/// The read models' queries, and the projections' progress: everything a reader asks of the
/// database that is not the log. It shares the event store's pool.
#[derive(Debug, Clone)]
pub struct PgReadModels {
    pool: Pool,
    endpoint: String,
    /// A connection of its own that every query runs on, holding the past read models of one
    /// entity ([`PgReadModels::as_of`]); `None` for the live ones, read from the pool.
    pinned: Option<Arc<as_of::Pinned>>,
    /// Leave for the past read models being read at once ([`as_of::AS_OF_AT_ONCE`]): each
    /// holds a connection of its own, outside the pool's count.
    as_of_leave: Arc<tokio::sync::Semaphore>,
}

impl PgReadModels {
    /// The read models of the database `store` writes to, over its pool.
    pub fn of(store: &PgEventStore) -> Self {
        Self {
            pool: store.pool().clone(),
            endpoint: store.endpoint().to_owned(),
            pinned: None,
            as_of_leave: Arc::new(tokio::sync::Semaphore::new(as_of::AS_OF_AT_ONCE)),
        }
    }

    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        if let Some(pinned) = &self.pinned {
            let client = pinned.client.lock().await;
            return Self::query_on(&client, sql, params).await.map_err(|e| self.driver(e));
        }
        let client = self.pool.get().await.map_err(|e| from_pool(e, &self.endpoint))?;
        Self::query_on(&client, sql, params).await.map_err(|e| self.driver(e))
    }

    async fn query_on(
        client: &deadpool_postgres::ClientWrapper,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = client.prepare_cached(sql).await?;
        client.query(&statement, params).await
    }

    fn driver(&self, error: tokio_postgres::Error) -> StoreError {
        from_driver(error, &self.endpoint)
    }
}

/// Most rows one page of a list returns.
pub const PAGE_ROWS_MAX: usize = 100;

/// A lease as its tenant sees it: no last error, no generation, no tenant id.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The tenant-safe columns of `leases`.
pub struct LeaseSummary {
    pub lease_id: LeaseId,
    pub provider_id: Uuid,
    pub status: String,
    pub chain_state: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub items: Vec<LeaseItem>,
    pub fail_count: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub retained_until: Option<DateTime<Utc>>,
    pub restored_from: Option<Uuid>,
}

/// Operator-only diagnostics of a lease.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of `lease_diagnostics`.
pub struct LeaseDiagnostics {
    pub lease_id: LeaseId,
    pub tenant_id: String,
    pub backend_name: Option<String>,
    pub last_error: Option<String>,
    pub fail_count: u32,
    pub generation: u64,
    pub budget_verdict: Option<String>,
    pub consecutive_failures: Option<u32>,
}

/// One release of a lease.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The tenant-safe columns of `releases`.
pub struct Release {
    pub version: u32,
    pub payload_hash: String,
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// One retained lease of a tenant: released, its data kept for a restore.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The tenant-safe columns of `retained_leases`.
pub struct RetainedLeaseRow {
    pub lease_id: LeaseId,
    pub provider_id: Uuid,
    /// `active` (restorable), `restoring` or `reaping`.
    pub status: String,
    pub retained_until: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// A tenant's usage of one kind of workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaUsage {
    /// The workload kind (`lease`, ...).
    pub kind: String,
    /// Workloads holding resources.
    pub active_count: u64,
    /// Quantities held, by SKU.
    pub skus: Vec<(String, u64)>,
    /// Snapshots only: their bytes, and the quota's limits (0: none).
    pub snapshot: Option<SnapshotLimits>,
    /// Each limit an operator set on this kind (events), beside what is used against it.
    pub limits: Vec<QuotaLimit>,
}

/// One limit of a tenant's, beside its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaLimit {
    /// What it limits (`runner.vcpu`, `runner.tier.linux-4x`, `snapshot.count`, ...).
    pub resource: String,
    /// What is used against it now.
    pub used: u64,
    /// The most allowed (0: no limit).
    pub max: u64,
}

/// A tenant's snapshot usage in bytes and its quota's limits, beside its count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// Bytes counted.
    pub bytes: u64,
    /// Most snapshots (0: no limit).
    pub max_count: u64,
    /// Most bytes (0: no limit).
    pub max_bytes: u64,
}

/// A filter and a position for listing leases, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseListing {
    /// Only leases with this status.
    pub status: Option<String>,
    /// Continue after this (created_at, lease_id), from the previous page's last row.
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Rows wanted, capped at [`PAGE_ROWS_MAX`] + 1 (one more than a page tells a caller
    /// whether another page follows).
    pub first: usize,
}

const SUMMARY_COLUMNS: &str = "lease_id, provider_id, status, chain_state, reason, message, \
     items, fail_count, created_at, updated_at, retained_until, restored_from";

fn corrupt(reason: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { position: 0, reason: reason.to_string() }
}

fn summary_of(row: &Row) -> Result<LeaseSummary, StoreError> {
    let items: serde_json::Value = row.get(6);
    Ok(LeaseSummary {
        lease_id: LeaseId(row.get(0)),
        provider_id: row.get(1),
        status: row.get(2),
        chain_state: row.get(3),
        reason: row.get(4),
        message: row.get(5),
        items: serde_json::from_value(items).map_err(corrupt)?,
        fail_count: u32::try_from(row.get::<_, i32>(7)).unwrap_or_default(),
        created_at: row.get(8),
        updated_at: row.get(9),
        retained_until: row.get(10),
        restored_from: row.get(11),
    })
}

impl PgReadModels {
    /// The tenant's lease, or `None` if it has no such lease (whoever else might).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn lease(
        &self,
        tenant: &TenantId,
        lease: LeaseId,
    ) -> Result<Option<LeaseSummary>, StoreError> {
        let sql =
            format!("SELECT {SUMMARY_COLUMNS} FROM leases WHERE tenant_id = $1 AND lease_id = $2");
        let rows = self.query(&sql, &[&tenant.as_str(), &lease.0]).await?;
        rows.first().map(summary_of).transpose()
    }

    /// One page of the tenant's leases, newest first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn leases(
        &self,
        tenant: &TenantId,
        listing: &LeaseListing,
    ) -> Result<Vec<LeaseSummary>, StoreError> {
        let limit = i64::try_from(listing.first.clamp(1, PAGE_ROWS_MAX + 1)).unwrap_or(1);
        let (after_at, after_id) =
            listing.after.map_or((None, None), |(at, id)| (Some(at), Some(id)));
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM leases WHERE tenant_id = $1 \
             AND ($2::text IS NULL OR status = $2) \
             AND ($3::timestamptz IS NULL OR (created_at, lease_id) < ($3, $4::uuid)) \
             ORDER BY created_at DESC, lease_id DESC LIMIT $5"
        );
        let rows = self
            .query(&sql, &[&tenant.as_str(), &listing.status, &after_at, &after_id, &limit])
            .await?;
        rows.iter().map(summary_of).collect()
    }

    /// The tenant's leases among `ids` (another tenant's, and unknown ones, are absent),
    /// newest first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn leases_by_id(
        &self,
        tenant: &TenantId,
        ids: &[Uuid],
    ) -> Result<Vec<LeaseSummary>, StoreError> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM leases WHERE tenant_id = $1 AND lease_id = ANY($2) \
             ORDER BY created_at DESC, lease_id DESC"
        );
        let rows = self.query(&sql, &[&tenant.as_str(), &ids]).await?;
        rows.iter().map(summary_of).collect()
    }

    /// The tenant's releases of a lease, oldest first (none for another tenant's lease).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn releases(
        &self,
        tenant: &TenantId,
        lease: LeaseId,
    ) -> Result<Vec<Release>, StoreError> {
        let rows = self
            .query(
                "SELECT version, payload_hash, status, reason, message, created_at FROM releases \
                 WHERE tenant_id = $1 AND lease_id = $2 ORDER BY version LIMIT 1000",
                &[&tenant.as_str(), &lease.0],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| Release {
                version: u32::try_from(row.get::<_, i32>(0)).unwrap_or_default(),
                payload_hash: row.get(1),
                status: row.get(2),
                reason: row.get(3),
                message: row.get(4),
                created_at: row.get(5),
            })
            .collect())
    }

    /// The tenant's retained leases, oldest deadline first, at most `limit`.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn retained_leases(
        &self,
        tenant: &TenantId,
        limit: usize,
    ) -> Result<Vec<RetainedLeaseRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                "SELECT lease_id, provider_id, status, retained_until, updated_at \
                 FROM retained_leases WHERE tenant_id = $1 \
                 ORDER BY retained_until ASC NULLS LAST, lease_id LIMIT $2",
                &[&tenant.as_str(), &limit],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| RetainedLeaseRow {
                lease_id: LeaseId(row.get(0)),
                provider_id: row.get(1),
                status: row.get(2),
                retained_until: row.get(3),
                updated_at: row.get(4),
            })
            .collect())
    }

    /// The tenant's usage, by workload kind, with its snapshots (`snapshot`: their count as
    /// the active count, their bytes and the quota's limits) once it has a snapshot quota.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn quota_usage(&self, tenant: &TenantId) -> Result<Vec<QuotaUsage>, StoreError> {
        let mut usage = self.workload_usage(tenant).await?;
        let unsigned = |value: i64| u64::try_from(value).unwrap_or_default();
        if let Some(snapshots) = self.snapshot_quota_usage(tenant).await? {
            let limit = |resource: &str, used: i64, max: i64| QuotaLimit {
                resource: resource.into(),
                used: unsigned(used),
                max: unsigned(max),
            };
            usage.push(QuotaUsage {
                kind: "snapshot".into(),
                active_count: unsigned(snapshots.count),
                skus: Vec::new(),
                snapshot: Some(SnapshotLimits {
                    bytes: unsigned(snapshots.bytes),
                    max_count: unsigned(snapshots.max_count),
                    max_bytes: unsigned(snapshots.max_bytes),
                }),
                limits: vec![
                    limit("snapshot.count", snapshots.count, snapshots.max_count),
                    limit("snapshot.bytes", snapshots.bytes, snapshots.max_bytes),
                ],
            });
        }
        let mut limited = self.workload_limits(tenant).await?;
        if let Some(limits) = self.runner_limits(tenant).await? {
            limited.push(("runner".into(), limits));
        }
        for (kind, limits) in limited {
            match usage.iter_mut().find(|usage| usage.kind == kind) {
                Some(usage) => usage.limits = limits,
                None => usage.push(QuotaUsage {
                    kind,
                    active_count: 0,
                    skus: Vec::new(),
                    snapshot: None,
                    limits,
                }),
            }
        }
        usage.sort_by(|a, b| a.kind.cmp(&b.kind));
        Ok(usage)
    }

    async fn workload_usage(&self, tenant: &TenantId) -> Result<Vec<QuotaUsage>, StoreError> {
        let rows = self
            .query(
                "SELECT u.kind, u.active_count, coalesce((SELECT array_agg(s.sku ORDER BY s.sku) \
                   FROM quota_usage_skus s WHERE s.tenant_id = u.tenant_id AND s.kind = u.kind \
                   AND s.quantity > 0), '{}'), \
                 coalesce((SELECT array_agg(s.quantity ORDER BY s.sku) FROM quota_usage_skus s \
                   WHERE s.tenant_id = u.tenant_id AND s.kind = u.kind AND s.quantity > 0), '{}') \
                 FROM quota_usage u WHERE u.tenant_id = $1 ORDER BY u.kind",
                &[&tenant.as_str()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let skus: Vec<String> = row.get(2);
                let quantities: Vec<i64> = row.get(3);
                QuotaUsage {
                    kind: row.get(0),
                    active_count: u64::try_from(row.get::<_, i64>(1)).unwrap_or_default(),
                    skus: skus
                        .into_iter()
                        .zip(quantities.into_iter().map(|q| u64::try_from(q).unwrap_or_default()))
                        .collect(),
                    snapshot: None,
                    limits: Vec::new(),
                }
            })
            .collect())
    }

    /// A lease's diagnostics, for operators only: never call this on a tenant's behalf.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn lease_diagnostics(
        &self,
        lease: LeaseId,
    ) -> Result<Option<LeaseDiagnostics>, StoreError> {
        let rows = self
            .query(
                "SELECT lease_id, tenant_id, backend_name, last_error, fail_count, generation, \
                 budget_verdict, consecutive_failures FROM lease_diagnostics WHERE lease_id = $1",
                &[&lease.0],
            )
            .await?;
        Ok(rows.first().map(|row| LeaseDiagnostics {
            lease_id: LeaseId(row.get(0)),
            tenant_id: row.get(1),
            backend_name: row.get(2),
            last_error: row.get(3),
            fail_count: u32::try_from(row.get::<_, i32>(4)).unwrap_or_default(),
            generation: u64::try_from(row.get::<_, i64>(5)).unwrap_or_default(),
            budget_verdict: row.get(6),
            consecutive_failures: row.get::<_, Option<i32>>(7).and_then(|n| u32::try_from(n).ok()),
        }))
    }

    /// The cursor projection `name` has reached, if it has applied anything.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn checkpoint(&self, name: &str) -> Result<Option<Cursor>, StoreError> {
        let rows = self
            .query(
                "SELECT log_epoch, tx_id, position FROM projection_checkpoints WHERE projection = $1",
                &[&name],
            )
            .await?;
        Ok(rows.first().map(cursor_of))
    }
}
