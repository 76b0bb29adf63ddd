//! What the runtime needs from storage. Implemented over PostgreSQL in `leasehold-adapters`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use leasehold_domain::{Cursor, LogPage, StoreError};
use tokio::sync::Notify;

use crate::projection::Projection;

/// Storage for one projection's runner: the log it reads, its lock, its views and its
/// checkpoint.
pub trait ProjectionStore<P: Projection>: Clone + Send + Sync + 'static {
    /// A connection holding the projection's lock.
    type Session: ProjectionSession<P>;

    /// Takes the projection's lock (a session advisory lock) on a connection of its own;
    /// `None` while another runner holds it.
    fn lock(&self) -> impl Future<Output = Result<Option<Self::Session>, StoreError>> + Send;

    /// Notified after this process appends to the log.
    fn appended(&self) -> Arc<Notify>;

    /// Up to `limit` events of the whole log after `after`, in commit order, never skipping
    /// one (as [`leasehold_domain::EventStore::read_log`]).
    fn read_log(
        &self,
        after: Cursor,
        limit: usize,
    ) -> impl Future<Output = Result<LogPage, StoreError>> + Send;

    /// Records why a session of the runner failed (and at which event's position, when an
    /// event could not be applied), for status readers in any process. Best effort: a
    /// failure to record is not an error.
    fn record_failure(
        &self,
        _error: &str,
        _position: Option<u64>,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Clears the recorded failure: the runner applies the log again (best effort).
    fn clear_failure(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A locked connection of one runner.
pub trait ProjectionSession<P: Projection>: Send {
    /// The cursor of the last event applied, if any was.
    fn checkpoint(&mut self) -> impl Future<Output = Result<Option<Cursor>, StoreError>> + Send;

    /// The stored views of `keys` (absent keys have none yet).
    fn views(
        &mut self,
        keys: &[P::Key],
    ) -> impl Future<Output = Result<HashMap<P::Key, P::View>, StoreError>> + Send;

    /// Applies `changes` and moves the checkpoint from `from` to `to` in one transaction,
    /// refusing (and applying nothing) if the checkpoint is no longer `from`.
    fn commit(
        &mut self,
        from: Option<Cursor>,
        to: Cursor,
        events: u64,
        changes: Vec<P::Change>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Storage for reconcilers: the log they read, and each one's lock and checkpoint.
pub trait ReconcilerStore: Clone + Send + Sync + 'static {
    /// A connection holding one reconciler's lock.
    type Session: ReconcilerSession;

    /// Takes reconciler `name`'s lock (a session advisory lock) on a connection of its own;
    /// `None` while another instance holds it. A checkpoint of another `version` is refused.
    fn lock_reconciler(
        &self,
        name: &'static str,
        version: u32,
    ) -> impl Future<Output = Result<Option<Self::Session>, StoreError>> + Send;

    /// Notified after this process appends to the log.
    fn appended(&self) -> Arc<Notify>;

    /// Up to `limit` events of the whole log after `after`, in commit order, never skipping
    /// one (as [`leasehold_domain::EventStore::read_log`]).
    fn read_log(
        &self,
        after: Cursor,
        limit: usize,
    ) -> impl Future<Output = Result<LogPage, StoreError>> + Send;
}

/// A locked connection of one reconciler.
pub trait ReconcilerSession: Send {
    /// The cursor of the last event it finished acting on, if any.
    fn checkpoint(&mut self) -> impl Future<Output = Result<Option<Cursor>, StoreError>> + Send;

    /// Moves the checkpoint from `from` to `to`, refusing if it is no longer `from`.
    fn advance(
        &mut self,
        from: Option<Cursor>,
        to: Cursor,
        events: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
