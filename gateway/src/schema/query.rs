//! Queries. Tenant queries read the read models filtered by the token's tenant, so another
//! tenant's lease is simply not found.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, ID, Object};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{LeaseListing, PAGE_ROWS_MAX};
use leasehold_domain::lease::LeaseId;
use uuid::Uuid;

use super::events::{EventConnection, EventFilter};
use super::lease::{LeaseFilter, LeaseView, QuotaUsageView};
use super::projections::ProjectionStatus;
use super::workloads::{Workload, WorkloadFilter};
use super::{caller, shared, tenant_of};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};

/// Rows a page holds when `first` is not given.
const PAGE_ROWS_DEFAULT: i32 = 20;

/// The root of every query.
#[derive(Debug, Default, Clone, Copy)]
pub struct QueryRoot;

/// `first`, checked against the cap.
pub(crate) fn page_rows(first: Option<i32>) -> ApiResult<usize> {
    let first = first.unwrap_or(PAGE_ROWS_DEFAULT);
    usize::try_from(first).ok().filter(|first| (1..=PAGE_ROWS_MAX).contains(first)).ok_or_else(
        || {
            ApiError::bad_input(format!(
                "first: must be between 1 and {PAGE_ROWS_MAX}, not {first}"
            ))
        },
    )
}

/// A UUID argument.
pub(crate) fn uuid_arg(field: &str, id: &ID) -> ApiResult<Uuid> {
    Uuid::parse_str(id.as_str()).map_err(|_| ApiError::bad_input(format!("{field}: not a UUID")))
}

#[Object(name = "Query")]
impl QueryRoot {
    /// One of your leases by id (`NOT_FOUND` when you have none with that id).
    async fn lease(&self, ctx: &Context<'_>, id: ID) -> ApiResult<LeaseView> {
        let tenant = tenant_of(ctx, "read leases")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let found = shared(ctx).store.lease(tenant, lease).await?;
        found.map(LeaseView::from).ok_or_else(|| ApiError::not_found("lease"))
    }

    /// Your leases, newest first.
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn leases(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Leases wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<LeaseFilter>,
    ) -> ApiResult<Connection<String, LeaseView>> {
        let tenant = tenant_of(ctx, "read leases")?;
        let state = shared(ctx);
        let scope = caller(ctx)?.cursor_scope();
        let first = page_rows(first)?;
        let after = after
            .map(|text| {
                state.cursors.open::<(DateTime<Utc>, Uuid)>(
                    CursorKind::Leases,
                    &scope,
                    "after",
                    &text,
                )
            })
            .transpose()?;
        // `Unknown` names no stored status: it matches nothing.
        let status = filter.and_then(|filter| filter.status).map(|status| {
            status
                .domain()
                .map_or("unknown", leasehold_domain::lease::LeaseStatus::name)
                .to_string()
        });
        // One row more than asked says whether there is a next page.
        let listing = LeaseListing { status, after, first: first + 1 };
        let mut rows = state.store.leases(tenant, &listing).await?;
        let has_next = rows.len() > first;
        rows.truncate(first);
        let mut connection = Connection::new(after.is_some(), has_next);
        for row in rows {
            let key = (row.created_at, row.lease_id.0);
            let cursor = state.cursors.seal(CursorKind::Leases, &scope, &key);
            connection.edges.push(Edge::new(cursor, LeaseView::from(row)));
        }
        Ok(connection)
    }

    /// The log in commit order: the whole log for auditors and operators, your own streams
    /// (without operator-only fields) for tenants. A page scans at most 50 events of the log
    /// per event asked for; when it stops early, `hasNextPage` is true and `endCursor` is
    /// where to go on.
    #[graphql(
        complexity = "first.unwrap_or(20).max(1) as usize * (child_complexity + super::events::SCAN_COMPLEXITY)"
    )]
    async fn events(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "A cursor you were given; events after it (default: from the start).")]
        after: Option<String>,
        #[graphql(desc = "Events wanted, 1 to 100 (default 20).")] first: Option<i32>,
        filter: Option<EventFilter>,
    ) -> ApiResult<EventConnection> {
        super::events::page(ctx, after, page_rows(first)?, filter).await
    }

    /// Your workloads of every kind, newest first.
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn workloads(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Workloads wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<WorkloadFilter>,
    ) -> ApiResult<Connection<String, Workload>> {
        super::workloads::page(ctx, page_rows(first)?, after, filter).await
    }

    /// Each projection's progress and lag (operators).
    async fn projections(&self, ctx: &Context<'_>) -> ApiResult<Vec<ProjectionStatus>> {
        super::projections::statuses(ctx).await
    }

    /// What your workloads hold now, by kind and SKU.
    async fn quota_usage(&self, ctx: &Context<'_>) -> ApiResult<Vec<QuotaUsageView>> {
        let tenant = tenant_of(ctx, "read quota usage")?;
        let usage = shared(ctx).store.quota_usage(tenant).await?;
        Ok(usage.into_iter().map(QuotaUsageView::from).collect())
    }
}
