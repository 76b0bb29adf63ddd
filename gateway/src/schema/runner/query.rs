//! The runner lease's queries, merged into the `Query` root.

use async_graphql::connection::Connection;
use async_graphql::{Context, ID, Object};
use leasehold_adapters::read_models::Entity;
use leasehold_adapters::read_models::RentedListing;

use super::types::{
    NodeRunnerLease, RunnerCapacityView, RunnerJob, RunnerLease, RunnerLeaseFilter, RunnerUsage,
};
use super::{node_agent, runners};
use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::events::read_models_as_of;
use crate::schema::query::uuid_arg;
use crate::schema::rented::{Page, reader_scope};
use crate::schema::{require, shared, tenant_of};

/// The runner lease's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunnerQuery;

#[Object]
impl RunnerQuery {
    /// One of your runner leases by id (`NOT_FOUND` when you have none with that id).
    /// Operators read any tenant's, with its node, epoch and instance.
    async fn runner_lease(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(desc = "A log cursor you were given: the runner lease as it was when the log \
                          stood there.")]
        as_of: Option<String>,
    ) -> ApiResult<RunnerLease> {
        let (scope, operator) = reader_scope(ctx, "read runner leases")?;
        let lease = uuid_arg("id", &id)?;
        let entity = Entity::RunnerLease(lease);
        let read_models =
            read_models_as_of(ctx, as_of.as_deref(), (entity, "runner lease"), scope.param())
                .await?;
        let found = read_models.runner_lease(scope, lease).await?;
        found
            .map(|row| RunnerLease::of(row, operator))
            .ok_or_else(|| ApiError::not_found("runner lease"))
    }

    /// Your runner leases, newest first (operators: every tenant's).
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn runner_leases(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Leases wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<RunnerLeaseFilter>,
    ) -> ApiResult<Connection<String, RunnerLease>> {
        let (scope, operator) = reader_scope(ctx, "read runner leases")?;
        let page = Page::open(ctx, CursorKind::RunnerLeases, (first, after))?;
        let state = filter.and_then(|filter| filter.phase);
        let listing = RentedListing { state, ..page.listing() };
        let rows = shared(ctx).read_models.runner_leases(scope, &listing).await?;
        page.connection(ctx, rows, |row| {
            ((row.created_at, row.lease_id), RunnerLease::of(row, operator))
        })
    }

    /// Your CI jobs as their runner leases saw them, the latest first (operators: every
    /// tenant's).
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn runner_jobs(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Jobs wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        #[graphql(desc = "Only jobs `assigned` or `finished`.")] status: Option<String>,
    ) -> ApiResult<Connection<String, RunnerJob>> {
        let (scope, _) = reader_scope(ctx, "read runner jobs")?;
        let page = Page::open(ctx, CursorKind::RunnerJobs, (first, after))?;
        let listing = RentedListing { state: status, ..page.listing() };
        let rows = shared(ctx).read_models.runner_jobs(scope, &listing).await?;
        page.connection(ctx, rows, |row| ((row.queued_at, row.job_id), RunnerJob::from(row)))
    }

    /// Your runner capacity: what is charged against your limits.
    async fn runner_capacity(&self, ctx: &Context<'_>) -> ApiResult<RunnerCapacityView> {
        let tenant = tenant_of(ctx, "read runner capacity")?;
        let capacity = Box::pin(runners(ctx).capacity(tenant)).await?;
        Ok(capacity.unwrap_or_default().into())
    }

    /// What every tier charges on every node now (operators).
    async fn runner_usage(&self, ctx: &Context<'_>) -> ApiResult<Vec<RunnerUsage>> {
        require(ctx, &[Role::Operator], "read runner usage")?;
        let rows = shared(ctx).read_models.runner_usage().await?;
        Ok(rows.into_iter().map(RunnerUsage::from).collect())
    }

    /// The runner leases bound to your node that have not ended, with the epoch to stamp
    /// your reports with (runner node agents).
    async fn node_runner_leases(&self, ctx: &Context<'_>) -> ApiResult<Vec<NodeRunnerLease>> {
        let node = node_agent(ctx, "read its node's runner leases")?.0;
        let holds = shared(ctx).read_models.runner_leases_on_node(node.as_str()).await?;
        Ok(holds.into_iter().map(NodeRunnerLease::from).collect())
    }
}
