//! The unified `workloads` listing, per tenant: every kind of rented compute in one list,
//! newest first. Tenant-safe columns only (no partition, no last error, no generation).

use chrono::{DateTime, Utc};
use leasehold_domain::{StoreError, TenantId};
use tokio_postgres::Row;
use uuid::Uuid;

use super::PAGE_ROWS_MAX;
use super::PgReadModels;

/// One workload as its tenant sees it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The tenant-safe columns of `workloads`.
pub struct WorkloadSummary {
    pub kind: String,
    pub workload_id: Uuid,
    pub status: String,
    pub backend_name: Option<String>,
    pub items: Vec<WorkloadItem>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What one workload runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadItem {
    /// The service, for stacks.
    pub service_name: Option<String>,
    /// The SKU.
    pub sku: String,
    /// How many.
    pub count: u64,
}

/// A filter and a position for listing workloads, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadListing {
    /// Only this kind (`lease`, ...).
    pub kind: Option<String>,
    /// Only this status.
    pub status: Option<String>,
    /// Continue after this (created_at, workload_id).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Rows wanted, capped at [`PAGE_ROWS_MAX`] + 1.
    pub first: usize,
}

fn items_of(items: &serde_json::Value) -> Vec<WorkloadItem> {
    let items = items.as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .map(|item| WorkloadItem {
            service_name: item["service_name"].as_str().map(str::to_string),
            sku: item["sku"].as_str().unwrap_or_default().to_string(),
            count: item["quantity"].as_u64().unwrap_or_default(),
        })
        .collect()
}

fn summary_of(row: &Row) -> WorkloadSummary {
    WorkloadSummary {
        kind: row.get(0),
        workload_id: row.get(1),
        status: row.get(2),
        backend_name: row.get(3),
        items: items_of(&row.get(4)),
        created_at: row.get(5),
        updated_at: row.get(6),
    }
}

impl PgReadModels {
    /// One page of the tenant's workloads, newest first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn workloads(
        &self,
        tenant: &TenantId,
        listing: &WorkloadListing,
    ) -> Result<Vec<WorkloadSummary>, StoreError> {
        let limit = i64::try_from(listing.first.clamp(1, PAGE_ROWS_MAX + 1)).unwrap_or(1);
        let (after_at, after_id) =
            listing.after.map_or((None, None), |(at, id)| (Some(at), Some(id)));
        let tenant_id = tenant.as_str();
        // Only the filters given are in the statement, so that a prepared plan can read the
        // index that matches them (`workloads_by_kind_state`) instead of filtering.
        let mut sql = String::from(
            "SELECT kind, workload_id, status, backend_name, items, created_at, updated_at \
             FROM workloads WHERE tenant_id = $1",
        );
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&tenant_id];
        for (column, value) in [("kind", &listing.kind), ("status", &listing.status)] {
            if let Some(value) = value {
                params.push(value);
                sql.push_str(&format!(" AND {column} = ${}", params.len()));
            }
        }
        if let (Some(at), Some(id)) = (&after_at, &after_id) {
            params.extend([at as &(dyn tokio_postgres::types::ToSql + Sync), id]);
            let (at, id) = (params.len() - 1, params.len());
            sql.push_str(&format!(" AND (created_at, workload_id) < (${at}, ${id})"));
        }
        params.push(&limit);
        sql.push_str(&format!(
            " ORDER BY created_at DESC, workload_id DESC LIMIT ${}",
            params.len()
        ));
        let rows = self.query(&sql, &params).await?;
        Ok(rows.iter().map(summary_of).collect())
    }
}
