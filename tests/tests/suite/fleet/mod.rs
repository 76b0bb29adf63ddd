//! The VM fleet through its services, against PostgreSQL: placement that reserves capacity
//! atomically under concurrent creates, capacity given back only on a boot failure or a
//! confirmed removal, fenced agent reports, and tenants kept apart.

mod artifacts;
mod capacity;
mod lifecycle;
mod moves;
mod read_models;
mod reaper;
mod secrets;
mod snapshot_gc;
mod snapshot_quota;
mod snapshots;
pub(crate) mod support;
