//! Leasehold's pure model: identifiers, the event envelope, the log cursor, expected versions and
//! the event-store port.
//!
//! This crate knows nothing about SQL, HTTP, an async runtime or the clock: time and new ids are
//! handed in by callers, and every outside effect goes through a port defined here and
//! implemented in `leasehold-adapters`.

mod cursor;
mod event;
mod ids;
pub mod limits;
mod store;
mod version;

pub use cursor::{Cursor, CursorParseError};
pub use event::{Actor, Metadata, NewEvent, RecordedEvent, StreamAppend};
pub use ids::{EventId, EventType, IdError, StreamId, StreamType, TenantId};
pub use store::{AppendOutcome, EventStore, LogPage, StoreError, ValidationError};
pub use version::ExpectedVersion;
