//! Time travel: one entity's read models as they were when the log stood at a cursor.
//!
//! [`PgReadModels::as_of`] takes a connection of its own out of the pool (never returned to
//! it: what it creates dies with it), creates a temporary table for each table the entity's
//! projection writes, shaped as the active one (a temporary table hides the table of the same
//! name from this connection's queries), folds the entity's stream up to the cursor through
//! the projection's own code and writers, in pages as a runner does, and answers the usual
//! queries on that connection. The same SQL then reads the rows the projection had written for
//! that entity when it reached the cursor, by construction rather than by a second reading of
//! the events. A query that joins another projection's rows (a rental's node) folds that
//! entity up to the same cursor too.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::ClientWrapper;
use leasehold_domain::lease::LeaseId;
use leasehold_domain::snapshot::SnapshotId;
use leasehold_domain::values::fleet::VmId;
use leasehold_domain::{Cursor, RecordedEvent, StoreError, StreamId};
use leasehold_projections::apply_batch;
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::node::NodeProjection;
use leasehold_projections::rental::RentalProjection;
use leasehold_projections::run::RunProjection;
use leasehold_projections::runner::RunnerProjection;
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_projections::vm::VmProjection;
use tokio::sync::Mutex;
use uuid::Uuid;

use super::PgReadModels;
use crate::projections::tables::{Owned, quoted};
use crate::projections::{PgProjected, ReadError, WriteError};
use crate::store::{EVENT_COLUMNS, Xid8, decode_all, from_driver, from_pool, to_i64};

/// Past read models read at once, at most: each holds a connection of its own (taken out of
/// the pool, which then opens another), so a burst of `asOf` queries waits here rather than
/// opening connections without bound.
pub(crate) const AS_OF_AT_ONCE: usize = 4;

/// How long a past read model waits for its turn before the caller is told to try again.
const AS_OF_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest one statement of a past read model may run (a fold's page, a query).
const AS_OF_STATEMENT_MS: u32 = 10_000;

/// The connection a past read model is read on, and its leave to be read now.
#[derive(Debug)]
pub(crate) struct Pinned {
    pub(crate) client: Mutex<ClientWrapper>,
    _leave: tokio::sync::OwnedSemaphorePermit,
}

/// Events folded per page: one page's changes are one transaction's writes.
const FOLD_PAGE_EVENTS: i64 = 1_000;

/// The entity a single-entity query reads, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entity {
    /// `lease(id)`.
    Lease(LeaseId),
    /// `vm(id)`.
    Vm(VmId),
    /// `snapshot(id)`.
    Snapshot(SnapshotId),
    /// `rental(id)`, beside its current node.
    Rental(Uuid),
    /// `run(id)`, beside its node and its rental.
    Run(Uuid),
    /// `runnerLease(id)`.
    RunnerLease(Uuid),
}

impl Entity {
    /// Its stream.
    fn stream_id(self) -> StreamId {
        match self {
            Self::Lease(lease) => lease.stream_id(),
            Self::Vm(vm) => vm.stream_id(),
            Self::Snapshot(snapshot) => snapshot.stream_id(),
            Self::Rental(id) => leasehold_domain::rental::RentalId(id).stream_id(),
            Self::Run(id) => leasehold_domain::run::RunId(id).stream_id(),
            Self::RunnerLease(id) => leasehold_domain::runner::RunnerLeaseId(id).stream_id(),
        }
    }
}

/// A connection holding temporary read-model tables folded up to one cursor.
#[derive(Debug)]
pub(crate) struct Past {
    client: ClientWrapper,
    at: Cursor,
    /// The tables already created (a shared parent once for all its partitions).
    created: HashSet<&'static str>,
}

impl PgReadModels {
    /// The read models of `entity` as they were when the projection of its kind had applied
    /// the log up to `at` (inclusive): the same queries, answered from the entity's stream
    /// folded up to there. Only `entity`'s rows (and those of what its query joins) are
    /// there; every other row is absent.
    ///
    /// # Errors
    /// When the database cannot be read, or an event cannot be projected.
    ///
    /// With `owner`, an entity whose stream another tenant owns (or none) is `None` before
    /// anything is folded: it costs no connection and takes no longer than an unknown id.
    pub async fn as_of(
        &self,
        at: Cursor,
        entity: Entity,
        owner: Option<&str>,
    ) -> Result<Option<PgReadModels>, StoreError> {
        if let Some(owner) = owner {
            let sql = "SELECT tenant_id FROM streams WHERE stream_id = $1";
            let rows = self.query(sql, &[&entity.stream_id().as_str()]).await?;
            if rows.first().map(|row| row.get::<_, &str>(0)) != Some(owner) {
                return Ok(None);
            }
        }
        let waited =
            tokio::time::timeout(AS_OF_WAIT, Arc::clone(&self.as_of_leave).acquire_owned());
        let leave = match waited.await {
            Ok(Ok(leave)) => leave,
            _ => {
                return Err(StoreError::Unavailable {
                    endpoint: self.endpoint.clone(),
                    reason: format!(
                        "{AS_OF_AT_ONCE} past read models are being read already: try again"
                    ),
                });
            }
        };
        let object = self.pool.get().await.map_err(|e| from_pool(e, &self.endpoint))?;
        let client = deadpool_postgres::Object::take(object);
        // Statements this connection prepared before name the active tables, not the
        // temporary ones that now hide them.
        client.statement_cache.clear();
        let bounded = format!("SET statement_timeout = {}", AS_OF_STATEMENT_MS);
        client.batch_execute(&bounded).await.map_err(|e| from_driver(e, &self.endpoint))?;
        let mut past = Past { client, at, created: HashSet::new() };
        past.fold_entity(entity).await.map_err(|error| self.store_error(error))?;
        Ok(Some(PgReadModels {
            pool: self.pool.clone(),
            endpoint: self.endpoint.clone(),
            pinned: Some(Arc::new(Pinned { client: Mutex::new(past.client), _leave: leave })),
            as_of_leave: Arc::clone(&self.as_of_leave),
        }))
    }

    fn store_error(&self, error: FoldError) -> StoreError {
        match error {
            FoldError::Driver(error) => from_driver(error, &self.endpoint),
            FoldError::Store(error) => error,
        }
    }
}

/// Why folding failed.
#[derive(Debug)]
enum FoldError {
    Driver(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for FoldError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Driver(error)
    }
}

impl From<StoreError> for FoldError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl From<WriteError> for FoldError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::Driver(error) => Self::Driver(error),
            WriteError::Store(error) => Self::Store(error),
        }
    }
}

impl From<ReadError> for FoldError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Driver(error) => Self::Driver(error),
            ReadError::Corrupt(reason) => Self::Store(StoreError::Corrupt { position: 0, reason }),
        }
    }
}

/// The stream's events up to a cursor, after a version, in version order (which is commit
/// order within one stream).
fn stream_page_sql() -> String {
    format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = $1 AND version > $2 \
         AND (log_epoch, tx_id, position) <= ($3, $4::xid8, $5) ORDER BY version LIMIT $6"
    )
}

impl Past {
    async fn fold_entity(&mut self, entity: Entity) -> Result<(), FoldError> {
        let stream = entity.stream_id();
        match entity {
            Entity::Lease(_) => self.fold(&LeaseProjection, &stream).await,
            Entity::Vm(_) => self.fold(&VmProjection, &stream).await,
            Entity::Snapshot(_) => self.fold(&SnapshotProjection, &stream).await,
            Entity::RunnerLease(_) => self.fold(&RunnerProjection, &stream).await,
            Entity::Rental(id) => {
                self.fold(&RentalProjection, &stream).await?;
                let node = self.joined("SELECT node_id FROM rentals WHERE rental_id = $1", id);
                self.fold_node(node.await?).await
            }
            Entity::Run(id) => {
                self.fold(&RunProjection, &stream).await?;
                let node = self.joined("SELECT node_id FROM run_timeline WHERE run_id = $1", id);
                self.fold_node(node.await?).await?;
                // The rental's tables hide the live ones even when the run names none.
                self.shadow(RentalProjection::TABLES).await?;
                let rental =
                    self.joined("SELECT rental_id FROM run_timeline WHERE run_id = $1", id);
                match rental.await? {
                    Some(rental) => {
                        let rental = leasehold_domain::rental::RentalId(rental);
                        self.fold(&RentalProjection, &rental.stream_id()).await
                    }
                    None => Ok(()),
                }
            }
        }
    }

    /// The node the folded rows name, folded too (the queries join its state).
    async fn fold_node(&mut self, node: Option<Uuid>) -> Result<(), FoldError> {
        // The node's tables hide the live ones even when the row names no node.
        self.shadow(NodeProjection::TABLES).await?;
        match node {
            Some(node) => {
                let node = leasehold_domain::node::NodeId(node);
                self.fold(&NodeProjection, &node.stream_id()).await
            }
            None => Ok(()),
        }
    }

    /// The id one folded row names (`sql` selects one uuid column by `id`).
    async fn joined(&self, sql: &str, id: Uuid) -> Result<Option<Uuid>, FoldError> {
        let rows = self.client.query(sql, &[&id]).await?;
        Ok(rows.first().and_then(|row| row.get::<_, Option<Uuid>>(0)))
    }

    /// Folds `stream` up to the cursor into `P`'s temporary tables (created on first use).
    async fn fold<P: PgProjected>(
        &mut self,
        projection: &P,
        stream: &StreamId,
    ) -> Result<(), FoldError> {
        self.shadow(P::TABLES).await?;
        let sql = stream_page_sql();
        let epoch = i32::try_from(self.at.log_epoch).unwrap_or(i32::MAX);
        let (tx_id, position) = (Xid8(self.at.tx_id), to_i64(self.at.position));
        let mut after = 0_i64;
        loop {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&stream.as_str(), &after, &epoch, &tx_id, &position, &FOLD_PAGE_EVENTS];
            let rows = self.client.query(&sql, &params).await?;
            let events = decode_all(&rows)?;
            let Some(last) = events.last() else { return Ok(()) };
            after = to_i64(last.version);
            self.apply(projection, &events).await?;
            if rows.len() < FOLD_PAGE_EVENTS as usize {
                return Ok(());
            }
        }
    }

    /// One page through the projection: the views it touches read back from the temporary
    /// tables, its changes written by the projection's own writer.
    async fn apply<P: PgProjected>(
        &mut self,
        projection: &P,
        events: &[RecordedEvent],
    ) -> Result<(), FoldError> {
        let keys = leasehold_projections::keys_of(projection, events);
        let views: HashMap<P::Key, P::View> = P::read_views(&self.client, &keys).await?;
        let changes = apply_batch(projection, views, events).map_err(|error| {
            StoreError::Corrupt { position: error.position, reason: error.to_string() }
        })?;
        let tx = self.client.transaction().await?;
        P::write_changes(&tx, changes).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Creates a temporary table for each of `tables` not created yet, shaped as the active
    /// one; a partition becomes a temporary partition of a temporary parent, so that both the
    /// writer (which names the partition) and the reader (which names the parent) find it.
    async fn shadow(&mut self, tables: &[Owned]) -> Result<(), FoldError> {
        for owned in tables {
            match *owned {
                Owned::Table(table) => {
                    if self.created.insert(table) {
                        self.create_like(table, "").await?;
                    }
                }
                Owned::Partition { parent, table, value } => {
                    if self.created.insert(parent) {
                        let key: String = self
                            .client
                            .query_one(
                                "SELECT pg_get_partkeydef(('public.' || quote_ident($1))::regclass)",
                                &[&parent],
                            )
                            .await?
                            .get(0);
                        self.create_like(parent, &format!(" PARTITION BY {key}")).await?;
                    }
                    if self.created.insert(table) {
                        let sql = format!(
                            "CREATE TEMPORARY TABLE {} PARTITION OF pg_temp.{} FOR VALUES IN ('{}')",
                            quoted(table),
                            quoted(parent),
                            value.replace('\'', "''")
                        );
                        self.client.batch_execute(&sql).await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn create_like(&self, table: &str, partitioned: &str) -> Result<(), FoldError> {
        let name = quoted(table);
        let sql = format!(
            "CREATE TEMPORARY TABLE {name} (LIKE public.{name} INCLUDING DEFAULTS \
             INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING INDEXES){partitioned}"
        );
        self.client.batch_execute(&sql).await?;
        Ok(())
    }
}
