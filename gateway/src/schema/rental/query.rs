//! The rental's queries, merged into the `Query` root.

use async_graphql::connection::Connection;
use async_graphql::{Context, ID, Object};
use leasehold_adapters::read_models::Entity;
use leasehold_adapters::read_models::RentedListing;

use super::types::{Rental, RentalFilter, RentalNode};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::events::read_models_as_of;
use crate::schema::query::uuid_arg;
use crate::schema::rented::{Page, reader_scope};
use crate::schema::shared;

/// The rental's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct RentalQuery;

#[Object]
impl RentalQuery {
    /// One of your rentals by id, beside its current node (`NOT_FOUND` when you have none
    /// with that id). Operators read any tenant's.
    async fn rental(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(
            desc = "A log cursor you were given: the rental (and its node) as it was when the log \
                          stood there."
        )]
        as_of: Option<String>,
    ) -> ApiResult<Rental> {
        let (scope, operator) = reader_scope(ctx, "read rentals")?;
        let rental = uuid_arg("id", &id)?;
        let read_models = read_models_as_of(
            ctx,
            as_of.as_deref(),
            (Entity::Rental(rental), "rental"),
            scope.param(),
        )
        .await?;
        let found = read_models.rental(scope, rental).await?;
        let now = shared(ctx).rented.rentals.pipeline().clock().now();
        found.map(|row| Rental::of(row, operator, now)).ok_or_else(|| ApiError::not_found("rental"))
    }

    /// Your rentals, newest first (operators: every tenant's).
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn rentals(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Rentals wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<RentalFilter>,
    ) -> ApiResult<Connection<String, Rental>> {
        let (scope, operator) = reader_scope(ctx, "read rentals")?;
        let page = Page::open(ctx, CursorKind::Rentals, (first, after))?;
        let state = filter.and_then(|filter| filter.state);
        let listing = RentedListing { state, ..page.listing() };
        let rows = shared(ctx).read_models.rentals(scope, &listing).await?;
        let now = shared(ctx).rented.rentals.pipeline().clock().now();
        page.connection(ctx, rows, |row| {
            ((row.created_at, row.rental_id), Rental::of(row, operator, now))
        })
    }

    /// The nodes of one of your rentals, newest generation first (`NOT_FOUND` when you have
    /// no such rental).
    async fn rental_nodes(&self, ctx: &Context<'_>, rental_id: ID) -> ApiResult<Vec<RentalNode>> {
        let (scope, _) = reader_scope(ctx, "read rentals")?;
        let rental = uuid_arg("rentalId", &rental_id)?;
        let state = shared(ctx);
        if state.read_models.rental(scope, rental).await?.is_none() {
            return Err(ApiError::not_found("rental"));
        }
        let now = state.rented.rentals.pipeline().clock().now();
        let nodes = state.read_models.rental_nodes(scope, rental).await?;
        Ok(nodes.into_iter().map(|node| RentalNode::of(node, now)).collect())
    }
}
