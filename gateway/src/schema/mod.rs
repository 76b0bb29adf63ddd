//! The GraphQL schema: queries over the read models and the log, each kind's mutations
//! through its command service, merged from one module per kind (`lease/`) and the
//! cross-kind ones (`query.rs`, `subscription.rs`). Resolvers find the shared [`AppState`] in the schema's data and the
//! verified [`Principal`] in the request's.

mod backends;
pub(crate) mod command;
pub(crate) mod events;
pub(crate) mod host;
pub(crate) mod lease;
pub mod projections;
mod query;
pub(crate) mod quota;
pub(crate) mod rental;
mod rented;
pub(crate) mod run;
pub(crate) mod runner;
pub(crate) mod snapshot;
mod subscription;
pub(crate) mod vm;
mod work_feed;
mod workloads;

use async_graphql::{Context, MergedObject, MergedSubscription, Schema};
use leasehold_domain::TenantId;

use crate::auth::{Principal, Role};
use crate::errors::{ApiError, ApiResult};
use crate::state::{AppState, Inner};

/// Registers every kind's GraphQL module in one line each: its query type and mutation type
/// are merged into the roots, and its `READS` joins [`KIND_READS`]. A new kind is one more
/// `module::{Query, Mutation}` here; a module serving a second kind names that kind's reads
/// after a `+` (the snapshot module's tenant quotas).
macro_rules! kinds {
    ($($kind:ident::{$query:ident, $mutation:ident} $(+ $more:ident)*),+ $(,)?) => {
        // Every query: those over every kind, then each kind's own. (Plain comments: a doc
        // comment would become the type's description.)
        #[derive(Debug, Default, MergedObject)]
        #[graphql(name = "Query")]
        pub struct QueryRoot(query::LogQuery, $($kind::$query),+);

        // Every mutation: the projections' control, then each kind's own.
        #[derive(Debug, Default, MergedObject)]
        #[graphql(name = "Mutation")]
        pub struct MutationRoot(projections::ProjectionMutation, $($kind::$mutation),+);

        /// What every kind's root query fields read, for read-your-writes.
        pub const KIND_READS: &[&crate::reads::KindReads] =
            &[$(&$kind::READS, $(&$kind::$more,)*)+];
    };
}

kinds!(
    lease::{LeaseQuery, LeaseMutation},
    vm::{VmQuery, VmMutation},
    host::{HostQuery, HostMutation},
    snapshot::{SnapshotQuery, SnapshotMutation} + QUOTA_READS,
    rental::{RentalQuery, RentalMutation} + NODE_READS,
    run::{RunQuery, RunMutation},
    runner::{RunnerQuery, RunnerMutation} + JOB_READS + CAPACITY_READS + NODE_READS,
    quota::{QuotaQuery, QuotaMutation},
);

// Every subscription.
#[derive(Debug, Default, MergedSubscription)]
#[graphql(name = "Subscription")]
pub struct SubscriptionRoot(
    subscription::LogSubscription,
    lease::LeaseSubscription,
    vm::VmSubscription,
);

/// The gateway's schema.
pub type LeaseholdSchema = Schema<QueryRoot, MutationRoot, SubscriptionRoot>;

/// The schema, with `state` available to every resolver and the configured limits.
pub fn build(state: &AppState) -> LeaseholdSchema {
    let config = &state.inner.config;
    Schema::build(QueryRoot::default(), MutationRoot::default(), SubscriptionRoot::default())
        .data(state.clone())
        .limit_depth(config.depth_max)
        .limit_complexity(config.complexity_max)
        .disable_suggestions()
        .finish()
}

/// The schema's SDL, as committed in `schema/graphql/schema.graphql`.
pub fn sdl() -> String {
    Schema::build(QueryRoot::default(), MutationRoot::default(), SubscriptionRoot::default())
        .finish()
        .sdl_with_options(
            async_graphql::SDLExportOptions::new().sorted_fields().sorted_enum_items(),
        )
}

/// The shared state.
pub(crate) fn shared<'a>(ctx: &Context<'a>) -> &'a Inner {
    &ctx.data_unchecked::<AppState>().inner
}

/// The verified caller (every request that reaches the executor has one).
pub(crate) fn caller<'a>(ctx: &Context<'a>) -> ApiResult<&'a Principal> {
    ctx.data_opt::<Principal>().ok_or_else(|| crate::auth::AuthError::Missing.into())
}

/// The caller's tenant; only tenant tokens act for a tenant.
pub(crate) fn tenant_of<'a>(ctx: &Context<'a>, what: &str) -> ApiResult<&'a TenantId> {
    let caller = caller(ctx)?;
    match (&caller.tenant, caller.role) {
        (Some(tenant), Role::Tenant) => Ok(tenant),
        _ => Err(ApiError::forbidden(what)),
    }
}

/// Refuses callers outside `roles`, and host, rental-connection and runner-node agents: their
/// tokens report on their host's VMs, their connection's rentals or their node's runner
/// leases only, never on leases (their `provider` is none, which on a lease agent would be
/// the all-providers grant).
pub(crate) fn require_lease<'a>(
    ctx: &Context<'a>,
    roles: &[Role],
    what: &str,
) -> ApiResult<&'a Principal> {
    let principal = require(ctx, roles, what)?;
    if principal.host.is_some() || principal.connection.is_some() || principal.runner_node.is_some()
    {
        return Err(ApiError::forbidden(what));
    }
    Ok(principal)
}

/// Refuses callers outside `roles`.
pub(crate) fn require<'a>(
    ctx: &Context<'a>,
    roles: &[Role],
    what: &str,
) -> ApiResult<&'a Principal> {
    let caller = caller(ctx)?;
    if roles.contains(&caller.role) { Ok(caller) } else { Err(ApiError::forbidden(what)) }
}
