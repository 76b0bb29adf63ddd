//! What a kind's projection brings to PostgreSQL, and everything it then gets for free.
//!
//! A projection implements [`PgProjected`] in its own file: how its stored views are read
//! and how a batch's changes are written to its tables. The runner's storage (the lock, the
//! log, the checkpoint moved in the same transaction as the changes) is the same for every
//! projection, and comes from the blanket implementations here.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::{Cursor, EventStore as _, LogPage, StoreError};
use leasehold_projections::{Projection, ProjectionSession, ProjectionStore};
use tokio::sync::Notify;

use super::{PgProjectionSession, PgProjectionStore, WriteError};

/// A projection whose read models live in PostgreSQL.
pub trait PgProjected: Projection {
    /// Every table it writes, and only it (its partitions of shared tables included): what a
    /// rebuild creates beside the active ones and a switch swaps (`build.rs`).
    const TABLES: &'static [super::tables::Owned];

    /// The stored views of `keys` (absent keys have none yet).
    fn read_views(
        client: &ClientWrapper,
        keys: &[Self::Key],
    ) -> impl Future<Output = Result<HashMap<Self::Key, Self::View>, ReadError>> + Send;

    /// Writes a batch's changes inside `tx` (the checkpoint moves in the same transaction).
    fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<Self::Change>,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// Why reading views failed.
#[derive(Debug)]
pub enum ReadError {
    /// The driver failed.
    Driver(tokio_postgres::Error),
    /// A stored view could not be decoded.
    Corrupt(String),
}

impl From<tokio_postgres::Error> for ReadError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Driver(error)
    }
}

/// A stored view, decoded (postcard), or why not.
pub(crate) fn decode<V: serde::de::DeserializeOwned>(
    what: impl std::fmt::Display,
    bytes: &[u8],
) -> Result<V, ReadError> {
    postcard::from_bytes(bytes).map_err(|error| {
        ReadError::Corrupt(format!("the view of {what} cannot be decoded: {error}"))
    })
}

/// A view encoded for storage (postcard).
pub(crate) fn encode<V: serde::Serialize>(what: &str, view: &V) -> Result<Vec<u8>, WriteError> {
    postcard::to_stdvec(view).map_err(|error| {
        WriteError::Store(StoreError::Database {
            reason: format!("encoding a {what} view: {error}"),
        })
    })
}

impl<P: PgProjected> ProjectionStore<P> for PgProjectionStore {
    type Session = PgProjectionSession;

    async fn lock(&self) -> Result<Option<PgProjectionSession>, StoreError> {
        self.lock_projection(P::NAME, P::VERSION).await
    }

    fn appended(&self) -> Arc<Notify> {
        self.log().appended()
    }

    async fn read_log(&self, after: Cursor, limit: usize) -> Result<LogPage, StoreError> {
        self.log().read_log(after, limit).await
    }

    async fn record_failure(&self, error: &str, position: Option<u64>) {
        if let Err(failed) = self.record_projection_failure(P::NAME, error, position).await {
            tracing::warn!(projection = P::NAME, %failed, "its failure could not be recorded");
        }
    }

    async fn clear_failure(&self) {
        if let Err(failed) = self.clear_projection_failure(P::NAME).await {
            tracing::warn!(projection = P::NAME, %failed, "its failure could not be cleared");
        }
    }
}

impl<P: PgProjected> ProjectionSession<P> for PgProjectionSession {
    async fn checkpoint(&mut self) -> Result<Option<Cursor>, StoreError> {
        self.read_checkpoint().await
    }

    async fn views(&mut self, keys: &[P::Key]) -> Result<HashMap<P::Key, P::View>, StoreError> {
        P::read_views(&self.client, keys).await.map_err(|error| match error {
            ReadError::Driver(error) => crate::store::from_driver(error, &self.endpoint),
            ReadError::Corrupt(reason) => StoreError::Corrupt { position: 0, reason },
        })
    }

    async fn commit(
        &mut self,
        from: Option<Cursor>,
        to: Cursor,
        events: u64,
        changes: Vec<P::Change>,
    ) -> Result<(), StoreError> {
        let identity = (self.name, self.version, self.kind, self.build_no);
        let endpoint = self.endpoint.clone();
        let fail = |error| crate::store::from_driver(error, &endpoint);
        let tx = self.client.transaction().await.map_err(fail)?;
        if !Self::move_checkpoint(&tx, identity, from, to, events).await.map_err(fail)? {
            return Err(StoreError::Database {
                reason: format!("the checkpoint of {} moved under this runner", identity.0),
            });
        }
        P::write_changes(&tx, changes).await.map_err(|error| match error {
            WriteError::Driver(error) => fail(error),
            WriteError::Store(error) => error,
        })?;
        tx.commit().await.map_err(fail)
    }
}

/// A kind's working states in a table `(<key> uuid PRIMARY KEY, tenant_id text, state
/// bytea)`: read by key, written by one multi-row statement per batch. A new kind keyed by a
/// UUID names its table here instead of writing both statements again.
pub(crate) struct UuidViewStates {
    /// The table.
    pub table: &'static str,
    /// Its key column.
    pub key: &'static str,
}

impl UuidViewStates {
    /// The stored views of `ids` (absent ids have none yet).
    pub(crate) async fn read<V: serde::de::DeserializeOwned>(
        &self,
        client: &ClientWrapper,
        ids: &[uuid::Uuid],
    ) -> Result<Vec<(uuid::Uuid, V)>, ReadError> {
        let sql = format!(
            "SELECT {key}, state FROM {table} WHERE {key} = ANY($1)",
            key = self.key,
            table = self.table
        );
        let statement = client.prepare_cached(&sql).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = Vec::with_capacity(rows.len());
        for row in rows {
            let id: uuid::Uuid = row.get(0);
            views.push((id, decode(format!("{} {id}", self.table), row.get(1))?));
        }
        Ok(views)
    }

    /// Writes `views` (id, owner, view), each replacing the one stored.
    pub(crate) async fn write<V: serde::Serialize>(
        &self,
        tx: &Transaction<'_>,
        views: &[(uuid::Uuid, &str, &V)],
    ) -> Result<(), super::WriteError> {
        if views.is_empty() {
            return Ok(());
        }
        let mut states = Vec::with_capacity(views.len());
        for (_, _, view) in views {
            states.push(encode(self.table, view)?);
        }
        let ids: Vec<uuid::Uuid> = views.iter().map(|(id, _, _)| *id).collect();
        let tenants: Vec<&str> = views.iter().map(|(_, tenant, _)| *tenant).collect();
        let sql = format!(
            "INSERT INTO {table} ({key}, tenant_id, state) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[]) \
             ON CONFLICT ({key}) DO UPDATE SET state = excluded.state",
            key = self.key,
            table = self.table,
        );
        super::execute(tx, &sql, &[&ids, &tenants, &states]).await
    }
}
