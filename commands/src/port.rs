//! What the pipeline needs from storage, beyond the event store: the idempotency ledger and
//! snapshots. Implemented over PostgreSQL in `leasehold-adapters`.

use std::future::Future;

use leasehold_domain::{
    AppendOutcome, Cursor, EventStore, LedgerEntry, RequestHash, StoreError, StreamAppend, StreamId,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A ledger row as recorded: the first request's hash and where its events went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The hash of the request that took the key.
    pub request_hash: RequestHash,
    /// The aggregate's stream.
    pub stream: StreamId,
    /// The stream's version after the command.
    pub version: u64,
    /// The cursor of the command's last event, or of the stream's last event before it if it
    /// changed nothing (`None` for an empty stream).
    pub cursor: Option<Cursor>,
    /// The types of the command's events, in order.
    pub event_types: Vec<String>,
}

/// Storage for the command pipeline.
pub trait CommandStore: EventStore {
    /// The ledger row of `ledger`'s `(tenant, namespace, key)`, if one is recorded.
    fn recorded(
        &self,
        ledger: &LedgerEntry,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send;

    /// Appends and records `ledger` in the same transaction; [`StoreError::OperationKeyTaken`]
    /// when the key was recorded first by another command.
    fn append_recorded(
        &self,
        appends: Vec<StreamAppend>,
        ledger: LedgerEntry,
    ) -> impl Future<Output = Result<AppendOutcome, StoreError>> + Send;

    /// Records a command that changed nothing, at the stream's `version`; `false` when the key
    /// was recorded first by another command.
    fn record_unchanged(
        &self,
        ledger: LedgerEntry,
        version: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The cursor of `stream`'s event at `version`, if stored.
    fn cursor_at(
        &self,
        stream: &StreamId,
        version: u64,
    ) -> impl Future<Output = Result<Option<Cursor>, StoreError>> + Send;

    /// The latest snapshot of `stream` in `state_schema`: its version and state.
    fn snapshot<T: DeserializeOwned + Send>(
        &self,
        stream: &StreamId,
        state_schema: u32,
    ) -> impl Future<Output = Result<Option<(u64, T)>, StoreError>> + Send;

    /// Stores a snapshot of `stream` at `version`.
    fn save_snapshot<T: Serialize + Sync>(
        &self,
        stream: &StreamId,
        version: u64,
        state_schema: u32,
        state: &T,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
