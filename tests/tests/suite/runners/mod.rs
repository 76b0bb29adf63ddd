//! Runner leases through their service, against PostgreSQL: the tenant's runner capacity
//! reserved in the assignment's own append (never exceeded by concurrent assignments from
//! separate processes), one lease per job, releases idempotent and contradictions
//! `CONFLICT`, reaps and their fence.

mod capacity;
mod leases;
mod read_models;
mod reconcilers;
pub(crate) mod support;
