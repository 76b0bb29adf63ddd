//! The reconcilers' storage: the same locks and checkpoint rows as the projections' (one
//! namespace of names), marked `reconciler`, with no read-model rows beside the checkpoint.

use std::sync::Arc;

use leasehold_domain::{Cursor, EventStore, LogPage, StoreError};
use leasehold_projections::{ReconcilerSession, ReconcilerStore};
use tokio::sync::Notify;

use super::{PgProjectionSession, PgProjectionStore};
use crate::store::from_driver;

impl ReconcilerStore for PgProjectionStore {
    type Session = PgProjectionSession;

    async fn lock_reconciler(
        &self,
        name: &'static str,
        version: u32,
    ) -> Result<Option<PgProjectionSession>, StoreError> {
        self.lock_named(name, version, "reconciler").await
    }

    fn appended(&self) -> Arc<Notify> {
        self.log().appended()
    }

    async fn read_log(&self, after: Cursor, limit: usize) -> Result<LogPage, StoreError> {
        self.log().read_log(after, limit).await
    }
}

impl ReconcilerSession for PgProjectionSession {
    async fn checkpoint(&mut self) -> Result<Option<Cursor>, StoreError> {
        self.read_checkpoint().await
    }

    async fn advance(
        &mut self,
        from: Option<Cursor>,
        to: Cursor,
        events: u64,
    ) -> Result<(), StoreError> {
        let identity = (self.name, self.version, self.kind, self.build_no);
        let endpoint = self.endpoint.clone();
        let fail = |error| from_driver(error, &endpoint);
        let tx = self.client.transaction().await.map_err(fail)?;
        if !Self::move_checkpoint(&tx, identity, from, to, events).await.map_err(fail)? {
            return Err(StoreError::Database {
                reason: format!("the checkpoint of {} moved under this reconciler", identity.0),
            });
        }
        tx.commit().await.map_err(fail)
    }
}
