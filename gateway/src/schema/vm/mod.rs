//! The VM kind in GraphQL: tenants create, drain, destroy and complete their VMs and read
//! them; host agents report on the VMs of their own host and, when the dispatcher does not
//! call them, take their host's work (`vmWork`). Merged into the roots
//! (`schema/mod.rs`).

mod mutation;
mod query;
pub(crate) mod types;
mod work;

pub use mutation::VmMutation;
pub use query::VmQuery;
pub use types::*;
pub use work::VmSubscription;

use crate::reads::KindReads;

/// What the VM's root query fields read: `vm` and `vms` the VM projection's `vms`.
/// (`deadLetters` reads what several projections write: it is one of the fields over every
/// kind, `reads::EVERY_KIND_FIELDS`.)
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::vm::Vm as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "vm_views",
    projection_fields: &["vm", "vms"],
    log_fields: &[],
    joins: &[],
};
