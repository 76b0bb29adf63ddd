//! The run's queries, merged into the `Query` root.

use async_graphql::connection::Connection;
use async_graphql::{Context, ID, Object};
use leasehold_adapters::read_models::Entity;
use leasehold_adapters::read_models::RentedListing;

use super::types::{Run, RunFilter};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::events::read_models_as_of;
use crate::schema::query::uuid_arg;
use crate::schema::rented::{Page, reader_scope};
use crate::schema::shared;

/// The run's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunQuery;

#[Object]
impl RunQuery {
    /// One of your runs by id (`NOT_FOUND` when you have none with that id). Operators read
    /// any tenant's.
    async fn run(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(
            desc = "A log cursor you were given: the run (and its node and rental) as it was when the log \
                          stood there."
        )]
        as_of: Option<String>,
    ) -> ApiResult<Run> {
        let (scope, _) = reader_scope(ctx, "read runs")?;
        let run = uuid_arg("id", &id)?;
        let read_models =
            read_models_as_of(ctx, as_of.as_deref(), (Entity::Run(run), "run"), scope.param())
                .await?;
        let found = read_models.run(scope, run).await?;
        found.map(Run::from).ok_or_else(|| ApiError::not_found("run"))
    }

    /// Your runs, newest first (operators: every tenant's).
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn runs(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Runs wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<RunFilter>,
    ) -> ApiResult<Connection<String, Run>> {
        let (scope, _) = reader_scope(ctx, "read runs")?;
        let page = Page::open(ctx, CursorKind::Runs, (first, after))?;
        let filter = filter.unwrap_or_default();
        let rental =
            filter.rental_id.as_ref().map(|id| uuid_arg("filter.rentalId", id)).transpose()?;
        let listing = RentedListing { state: filter.status, rental, ..page.listing() };
        let rows = shared(ctx).read_models.runs(scope, &listing).await?;
        page.connection(ctx, rows, |row| ((row.created_at, row.run_id), Run::from(row)))
    }
}
