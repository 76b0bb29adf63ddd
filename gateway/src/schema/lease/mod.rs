//! The lease kind in GraphQL: its types, queries and mutations, merged into the schema's
//! roots (`schema/mod.rs`). Every kind has a module like this one.

pub(crate) mod backend;
mod mutation;
mod query;
pub(crate) mod types;
mod work;

pub use backend::LeaseBackendQuery;
pub use mutation::LeaseMutation;
pub use query::LeaseReadQuery;
pub use types::*;
pub use work::LeaseSubscription;

/// The lease's queries: over its read models and the log, and read through to its backend.
#[derive(Debug, Default, async_graphql::MergedObject)]
pub struct LeaseQuery(LeaseReadQuery, LeaseBackendQuery);

use crate::reads::KindReads;

/// What the lease's root query fields read: `lease`, `leases`, `leaseReleases`,
/// `retainedLeases`, `leaseDiagnostics` (and, to find the lease's backend, `leaseConnection`
/// and `leaseLogs`) the lease projection's read models (`leasehold_projections::lease::LeaseProjection`), `leaseWork` the lease's stream.
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::lease::Lease as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "lease_views",
    projection_fields: &[
        "lease",
        "leases",
        "leaseReleases",
        "leaseConnection",
        "leaseLogs",
        "retainedLeases",
        "leaseDiagnostics",
    ],
    log_fields: &["leaseWork"],
    joins: &[],
};
