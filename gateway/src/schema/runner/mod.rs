//! The runner lease kind in GraphQL, by role: tenants request runner leases, assign their
//! jobs, release them and read them with their jobs and capacity; a runner node's agent (its
//! token names the node) registers its node, reports its inventory and reports on the leases
//! bound to it (instances, phases, heartbeats, teardowns, outcomes), fenced by epoch;
//! operators read every tenant's, see runner usage, force quarantine exits and set tenants'
//! runner capacity. Launches are the runner dispatcher's. Merged into the roots
//! (`schema/mod.rs`).

mod mutation;
mod query;
pub(crate) mod types;

pub use mutation::RunnerMutation;
pub use query::RunnerQuery;

use async_graphql::Context;
use leasehold_adapters::PgEventStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::runner_service::RunnerService;
use leasehold_domain::Aggregate;
use leasehold_domain::runner::{RunnerLease, RunnerNodeName};
use leasehold_domain::runner_capacity::RunnerCapacity;
use leasehold_domain::runner_job::RunnerJob;
use leasehold_domain::runner_node::RunnerNode;

use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::reads::KindReads;
use crate::schema::command::caller_of;
use crate::schema::{require, shared};

/// What the runner lease's root query fields read: the runner projection's `runner_leases`,
/// `runner_lease_holds` and `runner_usage`.
pub(crate) const READS: KindReads = KindReads {
    stream_type: RunnerLease::STREAM_TYPE,
    projection: "runner_views",
    projection_fields: &["runnerLease", "runnerLeases", "runnerUsage", "nodeRunnerLeases"],
    log_fields: &[],
    joins: &[],
};

/// What `runnerJobs` reads: the job projection's `job_history`.
pub(crate) const JOB_READS: KindReads = KindReads {
    stream_type: RunnerJob::STREAM_TYPE,
    projection: "runner_job_views",
    projection_fields: &["runnerJobs"],
    log_fields: &[],
    joins: &[],
};

/// What `runnerCapacity` reads: the tenant's capacity stream itself.
pub(crate) const CAPACITY_READS: KindReads = KindReads {
    stream_type: RunnerCapacity::STREAM_TYPE,
    projection: "runner_fleet_views",
    projection_fields: &[],
    log_fields: &["runnerCapacity"],
    joins: &[],
};

/// Runner nodes: their rows in the fleet projection's `runner_nodes`.
pub(crate) const NODE_READS: KindReads = KindReads {
    stream_type: RunnerNode::STREAM_TYPE,
    projection: "runner_fleet_views",
    projection_fields: &[],
    log_fields: &[],
    joins: &[],
};

/// The runner service the gateway's runner commands go through.
fn runners<'a>(ctx: &Context<'a>) -> &'a RunnerService<PgEventStore> {
    &shared(ctx).rented.runners
}

/// A runner node's agent: the node its token names, and it as a caller.
fn node_agent<'a>(ctx: &Context<'a>, what: &str) -> ApiResult<(&'a RunnerNodeName, Caller)> {
    let principal = require(ctx, &[Role::Agent], what)?;
    let node = principal.runner_node.as_ref().ok_or_else(|| ApiError::forbidden(what))?;
    Ok((node, caller_of(principal, None)))
}
