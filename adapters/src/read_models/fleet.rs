//! Queries over the fleet's read models: a tenant's VMs (tenant-safe columns only, filtered
//! by the tenant in SQL) and, for operators, the hosts.

use chrono::{DateTime, Utc};
use leasehold_domain::values::fleet::VmId;
use leasehold_domain::{StoreError, TenantId};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{PAGE_ROWS_MAX, PgReadModels};

/// A VM as its tenant sees it: no credentials' reference, no operation, no operator detail.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The tenant-safe columns of `vms`.
pub struct VmSummary {
    pub vm_id: VmId,
    pub task_id: String,
    pub state: String,
    pub task_state: Option<String>,
    pub host_id: Option<String>,
    pub url: Option<String>,
    pub spec: serde_json::Value,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub destroy_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub copied_from: Option<Uuid>,
    pub copy_kind: Option<String>,
    pub migrating_to: Option<Uuid>,
}

/// A filter and a position for listing VMs, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmListing {
    /// Only this state.
    pub state: Option<String>,
    /// Continue after this (created_at, vm_id).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Rows wanted, capped at [`PAGE_ROWS_MAX`] + 1.
    pub first: usize,
}

/// A host as operators see it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of `hosts`.
pub struct HostSummary {
    pub host_id: String,
    pub state: String,
    pub backend: String,
    pub region: Option<String>,
    pub url: String,
    pub labels: serde_json::Value,
    pub capacity: serde_json::Value,
    pub allocated: serde_json::Value,
    pub headroom: serde_json::Value,
    pub vm_count: i64,
    pub last_seen: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// A dead letter, as operators see it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of `dead_letters`.
pub struct DeadLetter {
    pub kind: String,
    pub entity_id: String,
    pub task_id: Option<String>,
    pub reason: String,
    pub retry_count: i32,
    pub payload: serde_json::Value,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

const VM_COLUMNS: &str = "vm_id, task_id, state, task_state, host_id, url, spec, reason, \
     message, destroy_reason, created_at, updated_at, copied_from, copy_kind, migrating_to";

const HOST_COLUMNS: &str = "host_id, state, backend, region, url, labels, capacity, allocated, \
     headroom, vm_count, last_seen, updated_at";

impl PgReadModels {
    /// One of the tenant's VMs (another tenant's is simply not found).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn vm(&self, tenant: &TenantId, vm: VmId) -> Result<Option<VmSummary>, StoreError> {
        let sql = format!("SELECT {VM_COLUMNS} FROM vms WHERE tenant_id = $1 AND vm_id = $2");
        let rows = self.query(&sql, &[&tenant.as_str(), &vm.0]).await?;
        Ok(rows.first().map(vm_of))
    }

    /// A page of the tenant's VMs, newest first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn vms(
        &self,
        tenant: &TenantId,
        listing: &VmListing,
    ) -> Result<Vec<VmSummary>, StoreError> {
        let limit = i64::try_from(listing.first.clamp(1, PAGE_ROWS_MAX + 1)).unwrap_or(1);
        let (after_at, after_id) =
            listing.after.map_or((None, None), |(at, id)| (Some(at), Some(id)));
        let sql = format!(
            "SELECT {VM_COLUMNS} FROM vms WHERE tenant_id = $1 \
             AND ($2::text IS NULL OR state = $2) \
             AND ($3::timestamptz IS NULL OR (created_at, vm_id) < ($3, $4::uuid)) \
             ORDER BY created_at DESC, vm_id DESC LIMIT $5"
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&tenant.as_str(), &listing.state, &after_at, &after_id, &limit];
        let rows = self.query(&sql, &params).await?;
        Ok(rows.iter().map(vm_of).collect())
    }

    /// The dead letters, newest first (operators), at most 500.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = self
            .query(
                "SELECT kind, entity_id, task_id, reason, retry_count, payload, first_seen, \
                 last_seen FROM dead_letters ORDER BY last_seen DESC, kind, entity_id LIMIT 500",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| DeadLetter {
                kind: row.get(0),
                entity_id: row.get(1),
                task_id: row.get(2),
                reason: row.get(3),
                retry_count: row.get(4),
                payload: row.get(5),
                first_seen: row.get(6),
                last_seen: row.get(7),
            })
            .collect())
    }

    /// Every host, by id (operators).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn hosts(&self) -> Result<Vec<HostSummary>, StoreError> {
        let sql = format!("SELECT {HOST_COLUMNS} FROM hosts ORDER BY host_id");
        let rows = self.query(&sql, &[]).await?;
        Ok(rows.iter().map(host_of).collect())
    }
}

fn vm_of(row: &Row) -> VmSummary {
    VmSummary {
        vm_id: VmId(row.get(0)),
        task_id: row.get(1),
        state: row.get(2),
        task_state: row.get(3),
        host_id: row.get(4),
        url: row.get(5),
        spec: row.get(6),
        reason: row.get(7),
        message: row.get(8),
        destroy_reason: row.get(9),
        created_at: row.get(10),
        updated_at: row.get(11),
        copied_from: row.get(12),
        copy_kind: row.get(13),
        migrating_to: row.get(14),
    }
}

fn host_of(row: &Row) -> HostSummary {
    HostSummary {
        host_id: row.get(0),
        state: row.get(1),
        backend: row.get(2),
        region: row.get(3),
        url: row.get(4),
        labels: row.get(5),
        capacity: row.get(6),
        allocated: row.get(7),
        headroom: row.get(8),
        vm_count: row.get(9),
        last_seen: row.get(10),
        updated_at: row.get(11),
    }
}
