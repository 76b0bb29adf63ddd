//! The rental kind in GraphQL: tenants provision, stop, resume and terminate rentals and read
//! them with their nodes; a provider connection's agent reports receipts and observations of
//! its connection's rentals; operators read every tenant's and may terminate any. Nodes
//! themselves speak the node-agent HTTP protocol (`docs/mercator-protocol.md` §2). Merged
//! into the roots (`schema/mod.rs`).

mod mutation;
mod query;
pub(crate) mod types;

pub use mutation::RentalMutation;
pub use query::RentalQuery;

use crate::reads::KindReads;

/// What the rental's root query fields read: `rental` and `rentals` the rental projection's
/// `rentals`, joined with the node projection's `nodes` (they wait for both).
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::rental::Rental as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "rental_views",
    projection_fields: &["rental", "rentals"],
    log_fields: &[],
    joins: &["node_views"],
};

/// What the node's root query field reads: `rentalNodes` the node projection's `nodes`.
pub(crate) const NODE_READS: KindReads = KindReads {
    stream_type: <leasehold_domain::node::Node as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "node_views",
    projection_fields: &["rentalNodes"],
    log_fields: &[],
    joins: &[],
};
