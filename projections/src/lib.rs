//! Projections: pure functions from the log's events to typed read-model changes, and the
//! runtime that applies them — one runner per projection, gap-safe reads from a checkpoint,
//! bounded batches, each batch's changes and checkpoint committed in one transaction.
//! Storage is reached through [`ProjectionStore`], implemented in `leasehold-adapters`.
//!
//! Beside them, the reconcilers' runtime ([`ReconcilerRunner`]): the log's readers that act
//! (commands, outside calls) instead of projecting, each with its own lock and checkpoint.

mod clock;
pub mod host;
pub mod lease;
pub mod limits;
pub mod node;
mod port;
mod projection;
mod reconciler;
pub mod rental;
pub mod run;
pub mod runner;
pub mod runner_fleet;
pub mod runner_job;
mod runtime;
pub mod shared;
pub mod snapshot;
pub mod vm;
pub mod workload_quota;

pub use clock::ManualClock;
pub use port::{ProjectionSession, ProjectionStore, ReconcilerSession, ReconcilerStore};
pub use projection::{Projection, ProjectionError, apply_batch, keys_of};
pub use reconciler::{
    ReconcileError, Reconciler, ReconcilerConfig, ReconcilerRunner, Seen, SweepSchedule,
    operation_key,
};
pub use runtime::{Runner, RunnerConfig, RunnerStats};
