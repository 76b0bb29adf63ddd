//! The run kind in GraphQL: tenants submit runs to their rentals and cancel them, and read
//! their timelines; operators read every tenant's. Nodes report on runs through the
//! node-agent HTTP protocol, fenced (`docs/mercator-protocol.md` §2). Merged into the roots
//! (`schema/mod.rs`).

mod mutation;
mod query;
pub(crate) mod types;

pub use mutation::RunMutation;
pub use query::RunQuery;

use crate::reads::KindReads;

/// What the run's root query fields read: `run` and `runs` the run projection's
/// `run_timeline`, joined with the node projection's `nodes` and the rental projection's
/// `rentals` (they wait for all three).
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::run::Run as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "run_views",
    projection_fields: &["run", "runs"],
    log_fields: &[],
    joins: &["node_views", "rental_views"],
};
