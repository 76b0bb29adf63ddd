//! The projection runtime's storage: a runner's locked connection, its checkpoint, and the
//! read-model writers of each projection (`lease.rs`, `vm.rs`, `host.rs`), each a
//! [`kind::PgProjected`] whose runner storage is shared (`kind.rs`).

mod build;
mod host;
mod kind;
mod lease;
mod node;
mod reconcilers;
mod rental;
mod run;
mod runner;
mod runner_fleet;
mod runner_job;
mod shared;
mod snapshot;
mod status;
pub mod tables;
mod vm;
mod workload_quota;

use deadpool_postgres::ClientWrapper;
use leasehold_domain::{Cursor, StoreError};

pub use build::{BuildError, BuildProgress, BuildStatus};
pub use host::PgHostCatalog;
pub use kind::PgProjected;
pub(crate) use kind::ReadError;
pub use status::ProjectionStatus;

use crate::store::{PgEventStore, Xid8, from_driver, to_i64};

/// The first key of every projection lock ("LH" in ASCII); the second is the name's hash.
const LOCK_CLASS: i32 = 0x4c48;

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// Why writing a batch's changes failed.
#[derive(Debug)]
pub enum WriteError {
    /// The driver failed.
    Driver(tokio_postgres::Error),
    /// Something else did.
    Store(StoreError),
}

impl From<tokio_postgres::Error> for WriteError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Driver(error)
    }
}

/// A projection's first checkpoint (in the build its session read: 0 before any rebuild).
const START_CHECKPOINT_SQL: &str = "INSERT INTO projection_checkpoints \
     (projection, version, log_epoch, tx_id, position, events_applied, kind, build_no) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING";

/// A projection's checkpoint moved, only from where it was and in the build it was read in
/// (else another writer moved it, or a rebuild was switched in: `build.rs`).
const MOVE_CHECKPOINT_SQL: &str = "UPDATE projection_checkpoints SET log_epoch = $2, \
     tx_id = $3, position = $4, events_applied = events_applied + $5, updated_at = now() \
     WHERE projection = $1 AND (log_epoch, tx_id, position) = ($6, $7, $8) AND build_no = $9";

/// Runs one prepared (cached) statement in `tx`.
pub(crate) async fn execute(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    params: &[Param<'_>],
) -> Result<(), WriteError> {
    let statement = tx.prepare_cached(sql).await?;
    tx.execute(&statement, params).await?;
    Ok(())
}

/// The projections' storage: each projection's lock, checkpoint and read-model writers, over
/// the log it reads (whose pool it shares).
#[derive(Debug, Clone)]
pub struct PgProjectionStore {
    log: PgEventStore,
}

impl PgProjectionStore {
    /// The projections' storage in the database `log` is in.
    pub fn new(log: PgEventStore) -> Self {
        Self { log }
    }

    /// The log the projections read.
    pub fn log(&self) -> &PgEventStore {
        &self.log
    }

    /// Forgets projection `name`'s failure: it applies the log again.
    pub(crate) async fn clear_projection_failure(&self, name: &str) -> Result<(), StoreError> {
        let client = self.log.client().await?;
        client
            .execute("DELETE FROM projection_failures WHERE projection = $1", &[&name])
            .await
            .map_err(|e| from_driver(e, self.log.endpoint()))?;
        Ok(())
    }

    /// Records projection `name`'s last failure (`projections status` shows it while it is
    /// newer than the projection's last commit).
    pub(crate) async fn record_projection_failure(
        &self,
        name: &str,
        error: &str,
        position: Option<u64>,
    ) -> Result<(), StoreError> {
        let client = self.log.client().await?;
        client
            .execute(
                "INSERT INTO projection_failures (projection, error, position) VALUES ($1, $2, $3) \
                 ON CONFLICT (projection) DO UPDATE SET error = excluded.error, \
                 position = excluded.position, failed_at = now()",
                &[&name, &error, &position.map(to_i64)],
            )
            .await
            .map_err(|e| from_driver(e, self.log.endpoint()))?;
        Ok(())
    }
}

/// A runner's own connection (never returned to the pool: the lock is the session's).
#[derive(Debug)]
pub struct PgProjectionSession {
    client: ClientWrapper,
    endpoint: String,
    name: &'static str,
    version: u32,
    /// `projection` or `reconciler`: what its checkpoint row says it is.
    kind: &'static str,
    /// The build its checkpoint was read in (0 before any rebuild).
    build_no: i32,
}

impl PgProjectionStore {
    /// A connection of its own holding projection `name`'s lock, or `None` if another
    /// session holds it.
    pub(crate) async fn lock_projection(
        &self,
        name: &'static str,
        version: u32,
    ) -> Result<Option<PgProjectionSession>, StoreError> {
        self.lock_named(name, version, "projection").await
    }

    /// The lock of a projection or a reconciler (one namespace: the checkpoints' key).
    async fn lock_named(
        &self,
        name: &'static str,
        version: u32,
        kind: &'static str,
    ) -> Result<Option<PgProjectionSession>, StoreError> {
        let client = deadpool_postgres::Object::take(self.log.client().await?);
        let endpoint = self.log.endpoint().to_owned();
        let row = client
            .query_one("SELECT pg_try_advisory_lock($1, hashtext($2))", &[&LOCK_CLASS, &name])
            .await
            .map_err(|e| from_driver(e, &endpoint))?;
        let locked: bool = row.get(0);
        Ok(locked.then_some(PgProjectionSession {
            client,
            endpoint,
            name,
            version,
            kind,
            build_no: 0,
        }))
    }
}

impl PgProjectionSession {
    fn fail(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        |error| from_driver(error, &self.endpoint)
    }

    /// The checkpoint; a checkpoint written by another version of the projection is refused
    /// (its tables hold that version's rows), and so is one of the other kind (a reconciler
    /// and a projection of the same name).
    pub(crate) async fn read_checkpoint(&mut self) -> Result<Option<Cursor>, StoreError> {
        let row = self
            .client
            .query_opt(
                "SELECT log_epoch, tx_id, position, version, kind, build_no \
                 FROM projection_checkpoints WHERE projection = $1",
                &[&self.name],
            )
            .await
            .map_err(self.fail())?;
        let Some(row) = row else { return Ok(None) };
        self.build_no = row.get(5);
        let version = u32::try_from(row.get::<_, i32>(3)).unwrap_or_default();
        let kind: &str = row.get(4);
        if kind != self.kind {
            return Err(StoreError::Database {
                reason: format!("{} is the name of a {kind}, not of a {}", self.name, self.kind),
            });
        }
        if version != self.version {
            return Err(StoreError::Database {
                reason: format!(
                    "{kind} {} has a checkpoint of version {version}, not {}: rebuild it",
                    self.name, self.version
                ),
            });
        }
        Ok(Some(crate::store::cursor_of(&row)))
    }

    /// Moves the checkpoint from `from` to `to` inside `tx`; `false` if it was not at `from`.
    pub(crate) async fn move_checkpoint(
        tx: &deadpool_postgres::Transaction<'_>,
        (name, version, kind, build_no): (&str, u32, &str, i32),
        from: Option<Cursor>,
        to: Cursor,
        events: u64,
    ) -> Result<bool, tokio_postgres::Error> {
        let epoch = i32::try_from(to.log_epoch).unwrap_or(i32::MAX);
        let version = i32::try_from(version).unwrap_or(i32::MAX);
        let (tx_id, position, events) = (Xid8(to.tx_id), to_i64(to.position), to_i64(events));
        let moved = match from {
            None => {
                let statement = tx.prepare_cached(START_CHECKPOINT_SQL).await?;
                tx.execute(
                    &statement,
                    &[&name, &version, &epoch, &tx_id, &position, &events, &kind, &build_no],
                )
                .await?
            }
            Some(from) => {
                let from_epoch = i32::try_from(from.log_epoch).unwrap_or(i32::MAX);
                // Prepared once per connection: it runs with every batch a projection applies.
                let statement = tx.prepare_cached(MOVE_CHECKPOINT_SQL).await?;
                tx.execute(
                    &statement,
                    &[
                        &name,
                        &epoch,
                        &tx_id,
                        &position,
                        &events,
                        &from_epoch,
                        &Xid8(from.tx_id),
                        &to_i64(from.position),
                        &build_no,
                    ],
                )
                .await?
            }
        };
        Ok(moved == 1)
    }
}
