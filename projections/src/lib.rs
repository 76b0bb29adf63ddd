//! Projections: pure functions from the log's events to typed read-model changes, and the
//! runtime that applies them — one runner per projection, gap-safe reads from a checkpoint,
//! bounded batches, each batch's changes and checkpoint committed in one transaction.
//! Storage is reached through [`ProjectionStore`], implemented in `leasehold-adapters`.

pub mod lease;
pub mod limits;
mod port;
mod projection;
mod runtime;
pub mod shared;

pub use port::{ProjectionSession, ProjectionStore};
pub use projection::{Projection, ProjectionError, apply_batch, keys_of};
pub use runtime::{Runner, RunnerConfig, RunnerStats};
