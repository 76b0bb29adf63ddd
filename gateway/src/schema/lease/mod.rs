//! The lease kind in GraphQL: its types, queries and mutations, merged into the schema's
//! roots (`schema/mod.rs`). Every kind has a module like this one.

mod mutation;
mod query;
mod types;

pub use mutation::LeaseMutation;
pub use query::LeaseQuery;
pub use types::*;

/// The projection the lease's fields read (`leasehold_projections::lease::LeaseProjection`).
pub(crate) const LEASE_PROJECTION: &str = "lease_views";
