//! The Run: one piece of work a tenant submits to rented capacity, with its attempts and its
//! booking on a rental's schedule (DOMAIN.md §1.7). Its aggregate comes with the next step;
//! its ids are here already because the rental's schedule and the node's orders name them.

pub mod values;

pub use values::{AttemptId, BookingId, RunId, WorkloadObservation, WorkloadPhase};
