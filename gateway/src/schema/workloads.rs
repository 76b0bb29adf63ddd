//! `workloads`: every kind of rented compute the tenant holds, in one Relay list.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, ID, InputObject, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{WorkloadListing, WorkloadSummary};
use uuid::Uuid;

use super::{caller, shared, tenant_of};
use crate::cursor::CursorKind;
use crate::errors::ApiResult;

/// What one workload runs.
#[derive(Debug, Clone, SimpleObject)]
pub struct WorkloadItem {
    /// The service, for stacks.
    pub service_name: Option<String>,
    /// The SKU.
    pub sku: String,
    /// How many.
    pub count: u64,
}

/// A workload of any kind.
#[derive(Debug, Clone, SimpleObject)]
pub struct Workload {
    /// Its id (for leases, the lease id).
    pub id: ID,
    /// Its kind (`lease`, ...).
    pub kind: String,
    /// Its status, in the kind's own words (`provisioning`, `ready`, ...).
    pub status: String,
    /// Where it is placed.
    pub backend_name: Option<String>,
    /// What it runs.
    pub items: Vec<WorkloadItem>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<WorkloadSummary> for Workload {
    fn from(workload: WorkloadSummary) -> Self {
        let items = workload.items.into_iter().map(|item| WorkloadItem {
            service_name: item.service_name,
            sku: item.sku,
            count: item.count,
        });
        Self {
            id: ID(workload.workload_id.to_string()),
            kind: workload.kind,
            status: workload.status,
            backend_name: workload.backend_name,
            items: items.collect(),
            created_at: workload.created_at,
            updated_at: workload.updated_at,
        }
    }
}

/// Which workloads to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct WorkloadFilter {
    /// Only this kind (`lease`, ...).
    pub kind: Option<String>,
    /// Only this status (`ready`, ...).
    pub status: Option<String>,
}

/// `workloads(first, after, filter)`.
pub(crate) async fn page(
    ctx: &Context<'_>,
    first: usize,
    after: Option<String>,
    filter: Option<WorkloadFilter>,
) -> ApiResult<Connection<String, Workload>> {
    let tenant = tenant_of(ctx, "read workloads")?;
    let state = shared(ctx);
    let scope = caller(ctx)?.cursor_scope();
    let after = after
        .map(|text| {
            state.cursors.open::<(DateTime<Utc>, Uuid)>(
                CursorKind::Workloads,
                &scope,
                "after",
                &text,
            )
        })
        .transpose()?;
    let filter = filter.unwrap_or_default();
    let listing =
        WorkloadListing { kind: filter.kind, status: filter.status, after, first: first + 1 };
    let mut rows = state.read_models.workloads(tenant, &listing).await?;
    let has_next = rows.len() > first;
    rows.truncate(first);
    let mut connection = Connection::new(after.is_some(), has_next);
    for row in rows {
        let key = (row.created_at, row.workload_id);
        let cursor = state.cursors.seal(CursorKind::Workloads, &scope, &key);
        connection.edges.push(Edge::new(cursor, Workload::from(row)));
    }
    Ok(connection)
}
