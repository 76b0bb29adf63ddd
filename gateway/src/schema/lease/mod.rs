//! The lease kind in GraphQL: its types, queries and mutations, merged into the schema's
//! roots (`schema/mod.rs`). Every kind has a module like this one.

mod mutation;
mod query;
mod types;

pub use mutation::LeaseMutation;
pub use query::LeaseQuery;
pub use types::*;

use crate::reads::KindReads;

/// What the lease's root query fields read: `lease`, `leases` and `leaseReleases` the lease
/// projection's read models (`leasehold_projections::lease::LeaseProjection`), `leaseWork` the lease's stream.
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::lease::Lease as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "lease_views",
    projection_fields: &["lease", "leases", "leaseReleases"],
    log_fields: &["leaseWork"],
};
