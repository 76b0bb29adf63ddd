//! The queries over every kind at once (each kind's own are in its module, merged into the
//! `Query` root). Tenant queries read the read models filtered by the token's tenant, so
//! another tenant's rows are simply not found.

use async_graphql::connection::Connection;
use async_graphql::{Context, ID, Object};
use leasehold_adapters::read_models::PAGE_ROWS_MAX;
use uuid::Uuid;

use super::events::{EventConnection, EventFilter};
use super::lease::QuotaUsageView;
use super::projections::ProjectionStatus;
use super::workloads::{Workload, WorkloadFilter};
use super::{shared, tenant_of};
use crate::errors::{ApiError, ApiResult};

/// Rows a page holds when `first` is not given.
const PAGE_ROWS_DEFAULT: i32 = 20;

/// The queries over every kind at once: the log, workloads, quotas, projections.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogQuery;

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

/// A tenant id argument (operators name the tenant they act on).
pub(crate) fn tenant_arg(tenant: &str) -> ApiResult<leasehold_domain::TenantId> {
    leasehold_domain::TenantId::parse(tenant)
        .map_err(|_| ApiError::bad_input("tenantId: not a tenant id"))
}

/// A UUID argument.
pub(crate) fn uuid_arg(field: &str, id: &ID) -> ApiResult<Uuid> {
    Uuid::parse_str(id.as_str()).map_err(|_| ApiError::bad_input(format!("{field}: not a UUID")))
}

#[Object]
impl LogQuery {
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
        #[graphql(
            desc = "A cursor you were given; events up to and including it only: the log as it \
                    stood then (the page ends there, `hasNextPage` false)."
        )]
        until: Option<String>,
    ) -> ApiResult<EventConnection> {
        let bounds = super::events::Bounds { after, until };
        super::events::page(ctx, bounds, page_rows(first)?, filter).await
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

    /// Each lease backend's health and last inventory sweep, with the orphans it found
    /// (operators).
    async fn backends(&self, ctx: &Context<'_>) -> ApiResult<Vec<super::backends::BackendView>> {
        super::backends::statuses(ctx).await
    }

    /// What your workloads hold now, by kind and SKU.
    async fn quota_usage(&self, ctx: &Context<'_>) -> ApiResult<Vec<QuotaUsageView>> {
        let tenant = tenant_of(ctx, "read quota usage")?;
        let usage = shared(ctx).read_models.quota_usage(tenant).await?;
        Ok(usage.into_iter().map(QuotaUsageView::from).collect())
    }
}
