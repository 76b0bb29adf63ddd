//! The command pipeline: load an aggregate (snapshot plus tail, or the state this process
//! remembers), decide, and append the events together with the idempotency ledger row, in the
//! order of checks of DOMAIN.md §0. Storage is reached through [`CommandStore`], implemented
//! in `leasehold-adapters`.
//!
//! Also here: turning outside input into typed commands ([`lease_input`]), so that every
//! command is validated, with the offending field named, before `decide` runs.

mod cache;
mod charges;
mod clock;
mod cross;
pub mod enrollment;
pub mod host_service;
mod lanes;
pub mod lease_input;
pub mod lease_service;
pub mod limits;
mod linked;
mod load;
pub mod node_service;
mod outcome;
mod pipeline;
mod port;
pub mod quota;
pub mod rental_service;
mod request;
mod routing;
pub mod run_service;
pub mod runner_service;
pub mod snapshot_service;
pub mod vm_input;
pub mod vm_service;

pub use clock::SystemClock;
pub use cross::{Link, LinkDecision, LinkError, LinkedCommand};
pub use outcome::{CommandError, CommandOutcome, ErrorClass};
pub use pipeline::{CommandPipeline, Follows, PipelineConfig};
pub use port::{CommandStore, Recorded};
pub use quota::workload_quota_of;
pub use request::{CommandRequest, caller_hash};
pub use routing::{BackendRouter, Routed};
