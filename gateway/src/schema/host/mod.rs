//! The host kind in GraphQL: operators register, cordon, drain, uncordon and remove hosts and
//! read them; a host's agent beats its heart. Merged into the roots (`schema/mod.rs`).

mod mutation;
mod query;
mod types;

pub use mutation::HostMutation;
pub use query::HostQuery;

use crate::reads::KindReads;

/// What the host's root query fields read: `hosts` the host projection's `hosts`.
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::host::Host as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "host_views",
    projection_fields: &["hosts"],
    log_fields: &[],
    joins: &[],
};
