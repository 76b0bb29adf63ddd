//! Leasehold's pure model: identifiers, the event envelope, the log cursor, expected versions,
//! the event-store port, and the aggregates (deciders) with their commands and events.
//!
//! This crate knows nothing about SQL, HTTP, an async runtime or the clock: time and new ids are
//! handed in by callers (the [`Clock`] port is defined here and read elsewhere), and every
//! outside effect goes through a port defined here and implemented in `leasehold-adapters`.

pub mod aggregate;
mod clock;
mod cursor;
mod event;
pub mod host;
mod ids;
pub mod lease;
mod ledger;
pub mod limits;
pub mod node;
pub mod quota;
pub mod registry;
pub mod rental;
pub mod run;
pub mod runner;
pub mod runner_capacity;
pub mod runner_job;
pub mod runner_node;
pub mod snapshot;
mod store;
pub mod values;
mod version;
pub mod vm;
pub mod workload_quota;

pub use aggregate::{Aggregate, Context, DomainEvent, EventDecodeError, Refusal, RefusalKind};
pub use clock::{Clock, to_micros};
pub use cursor::{Cursor, CursorParseError};
pub use event::{Actor, Metadata, NewEvent, RecordedEvent, StreamAppend};
pub use ids::{EventId, EventType, IdError, OperationKey, StreamId, StreamType, TenantId};
pub use ledger::{KeyNamespace, LedgerEntry, RequestHash};
pub use registry::{AggregateKind, EventView};
pub use store::{AppendOutcome, EventStore, LogPage, StoreError, ValidationError};
pub use version::ExpectedVersion;
