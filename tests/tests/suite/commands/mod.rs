//! The command pipeline against a real PostgreSQL: idempotency, fencing, state guards,
//! concurrent commands on one aggregate, tenants, snapshots.

mod concurrency;
mod cross;
mod idempotency;
mod lease;
mod restore;
mod service;
pub(crate) mod support;
mod workload_quota;
