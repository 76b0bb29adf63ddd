//! Queries over the snapshot read models: a tenant's snapshots (the seed's filters, newest
//! first; tenant-safe columns only, the tenant in every query, `last_error` never selected),
//! and the snapshot quota usage (a tenant its own; operators every tenant's).

use chrono::{DateTime, Utc};
use leasehold_domain::snapshot::SnapshotId;
use leasehold_domain::{StoreError, TenantId};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{PAGE_ROWS_MAX, PgReadModels};

/// A snapshot as its tenant sees it: no operator detail, no tenant id.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The tenant-safe columns of `snapshot_records`.
pub struct SnapshotSummary {
    pub snapshot_id: SnapshotId,
    pub vm_id: Uuid,
    pub task_id: String,
    pub host_id: String,
    pub state: String,
    pub mode: String,
    pub requested: String,
    pub kind: Option<String>,
    pub parent_snapshot_id: Option<Uuid>,
    pub layer_key: Option<String>,
    pub arch: String,
    pub digest: Option<String>,
    pub name: Option<String>,
    pub size_bytes: i64,
    pub retention_until: Option<DateTime<Utc>>,
    pub exports: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub last_used: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// The seed's filters and a position for listing snapshots, newest first. Every filter is
/// an exact match; none set lists them all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotPage {
    /// Only this VM's.
    pub vm: Option<Uuid>,
    /// Only this task's.
    pub task: Option<String>,
    /// Only in this state.
    pub state: Option<String>,
    /// Only of this mode.
    pub mode: Option<String>,
    /// Only with this layer key.
    pub layer_key: Option<String>,
    /// Only built on this arch.
    pub arch: Option<String>,
    /// Only with this name.
    pub name: Option<String>,
    /// Continue after this (created_at, snapshot_id).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Rows wanted, capped at [`PAGE_ROWS_MAX`] + 1.
    pub first: usize,
}

/// A tenant's snapshot quota: what it counts against its limits (0: no limit).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The columns of `snapshot_quota_usage`.
pub struct SnapshotQuotaUsage {
    pub tenant_id: String,
    pub count: i64,
    pub bytes: i64,
    pub max_count: i64,
    pub max_bytes: i64,
    pub updated_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "snapshot_id, vm_id, task_id, host_id, state, mode, requested, kind, \
     parent_snapshot_id, layer_key, arch, digest, name, size_bytes, retention_until, exports, \
     created_at, last_used, updated_at";

const USAGE_COLUMNS: &str = "tenant_id, count, bytes, max_count, max_bytes, updated_at";

impl PgReadModels {
    /// One of the tenant's snapshots (another tenant's is simply not found).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn snapshot(
        &self,
        tenant: &TenantId,
        snapshot: SnapshotId,
    ) -> Result<Option<SnapshotSummary>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshot_records WHERE tenant_id = $1 AND snapshot_id = $2"
        );
        let rows = self.query(&sql, &[&tenant.as_str(), &snapshot.0]).await?;
        Ok(rows.first().map(summary_of))
    }

    /// A page of the tenant's snapshots, newest first, filtered as `page` says.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn snapshots(
        &self,
        tenant: &TenantId,
        page: &SnapshotPage,
    ) -> Result<Vec<SnapshotSummary>, StoreError> {
        let limit = i64::try_from(page.first.clamp(1, PAGE_ROWS_MAX + 1)).unwrap_or(1);
        let (after_at, after_id) = page.after.map_or((None, None), |(at, id)| (Some(at), Some(id)));
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshot_records WHERE tenant_id = $1 \
             AND ($2::uuid IS NULL OR vm_id = $2) AND ($3::text IS NULL OR task_id = $3) \
             AND ($4::text IS NULL OR state = $4) AND ($5::text IS NULL OR mode = $5) \
             AND ($6::text IS NULL OR layer_key = $6) AND ($7::text IS NULL OR arch = $7) \
             AND ($8::text IS NULL OR name = $8) \
             AND ($9::timestamptz IS NULL OR (created_at, snapshot_id) < ($9, $10::uuid)) \
             ORDER BY created_at DESC, snapshot_id DESC LIMIT $11"
        );
        let params: [&(dyn ToSql + Sync); 11] = [
            &tenant.as_str(),
            &page.vm,
            &page.task,
            &page.state,
            &page.mode,
            &page.layer_key,
            &page.arch,
            &page.name,
            &after_at,
            &after_id,
            &limit,
        ];
        let rows = self.query(&sql, &params).await?;
        Ok(rows.iter().map(summary_of).collect())
    }

    /// The tenant's snapshot quota usage (none until its first snapshot or limits).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn snapshot_quota_usage(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<SnapshotQuotaUsage>, StoreError> {
        let sql = format!("SELECT {USAGE_COLUMNS} FROM snapshot_quota_usage WHERE tenant_id = $1");
        let rows = self.query(&sql, &[&tenant.as_str()]).await?;
        Ok(rows.first().map(usage_of))
    }

    /// Every tenant's snapshot quota usage, by tenant (operators), at most 1,000.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn snapshot_quota_usages(&self) -> Result<Vec<SnapshotQuotaUsage>, StoreError> {
        let sql = format!(
            "SELECT {USAGE_COLUMNS} FROM snapshot_quota_usage ORDER BY tenant_id LIMIT 1000"
        );
        let rows = self.query(&sql, &[]).await?;
        Ok(rows.iter().map(usage_of).collect())
    }
}

fn summary_of(row: &Row) -> SnapshotSummary {
    SnapshotSummary {
        snapshot_id: SnapshotId(row.get(0)),
        vm_id: row.get(1),
        task_id: row.get(2),
        host_id: row.get(3),
        state: row.get(4),
        mode: row.get(5),
        requested: row.get(6),
        kind: row.get(7),
        parent_snapshot_id: row.get(8),
        layer_key: row.get(9),
        arch: row.get(10),
        digest: row.get(11),
        name: row.get(12),
        size_bytes: row.get(13),
        retention_until: row.get(14),
        exports: row.get(15),
        created_at: row.get(16),
        last_used: row.get(17),
        updated_at: row.get(18),
    }
}

fn usage_of(row: &Row) -> SnapshotQuotaUsage {
    SnapshotQuotaUsage {
        tenant_id: row.get(0),
        count: row.get(1),
        bytes: row.get(2),
        max_count: row.get(3),
        max_bytes: row.get(4),
        updated_at: row.get(5),
    }
}
