//! The host's queries, merged into the `Query` root.

use async_graphql::{Context, Object};

use super::types::Host;
use crate::auth::Role;
use crate::errors::ApiResult;
use crate::schema::{require, shared};

/// The host's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostQuery;

#[Object]
impl HostQuery {
    /// Every host of the fleet, by id (operators): capacity, allocation, headroom, labels,
    /// state, last seen and backend.
    async fn hosts(&self, ctx: &Context<'_>) -> ApiResult<Vec<Host>> {
        require(ctx, &[Role::Operator], "read hosts")?;
        let hosts = shared(ctx).read_models.hosts().await?;
        Ok(hosts.into_iter().map(Host::from).collect())
    }
}
