//! Rebuilding a projection without downtime (DESIGN.md, "Projections").
//!
//! A build is a new version of a projection's read models, written into a schema of its own
//! (`lh_<projection>_<build_no>`, its tables shaped as the active ones: `tables.rs`) from the
//! start of the log in bounded batches, each committed with the build's own checkpoint in
//! `projection_builds`, while the active tables keep serving and their runner keeps
//! applying. A build is resumed where it stopped (a killed rebuild started again goes on from
//! its checkpoint). It never issues a command: reconcilers read the active tables only.
//!
//! The switch: when the build has reached the end of the log, one transaction
//! locks the active checkpoint's row (the active runner's next commit waits on it), lets the
//! build catch up to that frozen cursor, moves the active tables into their build's schema
//! (kept for `activate`, until `drop`) and the build's into `public` (a partition of a shared
//! table detached and attached again), and moves the checkpoint to the build, whose number
//! fences the old runner: its waiting commit finds the build changed and writes nothing, and
//! its next session goes on from the switched checkpoint, over the new tables. Readers wait
//! for the switch's locks and then read the new tables: never an empty or partial table.

use deadpool_postgres::{ClientWrapper, GenericClient, Transaction};
use leasehold_domain::{Cursor, EventStore as _, RecordedEvent, StoreError};
use leasehold_projections::{ProjectionError, apply_batch, keys_of};
use tokio_postgres::error::SqlState;

use super::kind::{PgProjected, ReadError};
use super::tables::{Owned, copy_shape, quoted};
use super::{PgProjectionStore, WriteError};
use crate::store::{Xid8, from_driver, to_i64};

/// The first key of the lock every build operation of one projection holds ("LB").
const BUILD_LOCK_CLASS: i32 = 0x4c42;

/// How long a switch waits for its tables' locks before it lets go and tries again: well
/// under PostgreSQL's `deadlock_timeout` (1 s), so that a reader waiting on the switch is
/// never the one a deadlock aborts, and no reader waits longer.
const SWITCH_LOCK_TIMEOUT: &str = "200ms";

/// Attempts at a switch before it gives up.
const SWITCH_ATTEMPTS_MAX: usize = 100;

/// Why a build operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An event the projection cannot read: the build is failed at it.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// Another process is rebuilding, activating or dropping a build of this projection.
    #[error("another process is rebuilding, activating or dropping a build of {0}")]
    Busy(String),
    /// The operation does not apply to that build.
    #[error("{0}")]
    Refused(String),
}

/// One build of a projection, as `projection_builds` records it.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildStatus {
    /// The projection.
    pub projection: String,
    /// Its number (0: the tables from before the first rebuild).
    pub build_no: u32,
    /// The projection's code version it was built by.
    pub version: u32,
    /// `building`, `active`, `retired` (kept for `activate`) or `failed`.
    pub state: String,
    /// The cursor of the last event it applied.
    pub cursor: Option<Cursor>,
    /// Events it applied.
    pub events_applied: u64,
    /// Events the log held when it began.
    pub events_total: u64,
    /// Why it failed, and at which event's position.
    pub error: Option<(String, Option<u64>)>,
    /// When it began, last moved, and was switched in.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// When it last applied a batch or changed state.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// When it was last switched in.
    pub switched_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// How far a build has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildProgress {
    /// The build.
    pub build_no: u32,
    /// Events applied.
    pub applied: u64,
    /// Events the log held when it began.
    pub total: u64,
}

/// The build in progress on one connection.
struct Build {
    name: &'static str,
    build_no: i32,
    after: Cursor,
    applied: u64,
    total: u64,
}

/// The active checkpoint: its code version, cursor, events and build.
#[derive(Debug, Clone, Copy)]
struct Active {
    version: u32,
    cursor: Cursor,
    events: i64,
    build_no: i32,
}

/// The schema of a build's tables while they are not active.
fn schema_of(name: &str, build_no: i32) -> String {
    format!("lh_{name}_{build_no}")
}

const ACTIVE_SQL: &str = "SELECT log_epoch, tx_id, position, version, events_applied, build_no \
     FROM public.projection_checkpoints WHERE projection = $1 AND kind = 'projection'";

const BUILDING_SQL: &str = "SELECT build_no, version, log_epoch, tx_id, position, \
     events_applied, events_total FROM public.projection_builds \
     WHERE projection = $1 AND state = 'building'";

const MOVE_BUILD_SQL: &str = "UPDATE public.projection_builds SET log_epoch = $3, tx_id = $4, \
     position = $5, events_applied = events_applied + $6, updated_at = now() \
     WHERE projection = $1 AND build_no = $2 AND state = 'building'";

/// How long a build waits for another process's build lock before it is [`BuildError::Busy`].
const BUILD_LOCK_WAIT: &str = "SET lock_timeout = '2s'";

impl PgProjectionStore {
    /// A connection of its own holding `name`'s build lock, or [`BuildError::Busy`] if
    /// another holds it for [`BUILD_LOCK_WAIT`]: a command run just after another finds the
    /// lock free once the other's session has ended, which the server sees a moment after
    /// the other process exits.
    async fn build_lock(&self, name: &str) -> Result<ClientWrapper, BuildError> {
        let client = deadpool_postgres::Object::take(self.log().client().await?);
        let fail = |e| from_driver(e, self.log().endpoint());
        client.batch_execute(BUILD_LOCK_WAIT).await.map_err(fail)?;
        let locked = client
            .query_one("SELECT pg_advisory_lock($1, hashtext($2))", &[&BUILD_LOCK_CLASS, &name])
            .await;
        match locked {
            Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                Err(BuildError::Busy(name.to_owned()))
            }
            Err(error) => Err(fail(error).into()),
            Ok(_) => {
                client.batch_execute("SET lock_timeout = 0").await.map_err(fail)?;
                Ok(client)
            }
        }
    }

    fn fail(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        |error| from_driver(error, self.log().endpoint())
    }

    /// Builds a new version of `P`'s read models beside the active ones (or resumes the build
    /// in progress), then switches readers to it in one transaction; returns its number.
    /// `progress` is called after each batch.
    ///
    /// # Errors
    /// [`BuildError`]; an event the projection cannot read fails the build (recorded, shown
    /// by `projections status`), the active tables untouched.
    pub async fn rebuild<P: PgProjected>(
        &self,
        projection: &P,
        batch_events: usize,
        mut progress: impl FnMut(BuildProgress),
    ) -> Result<u32, BuildError> {
        let mut client = self.build_lock(P::NAME).await?;
        let mut build = self.begin_build::<P>(&mut client).await?;
        let schema = schema_of(P::NAME, build.build_no);
        // Its schema alone: a table the projection writes but does not declare fails the
        // build instead of reaching the active one in `public`.
        client
            .batch_execute(&format!("SET search_path TO {}", quoted(&schema)))
            .await
            .map_err(self.fail())?;
        // To the end of the log as it stands: the active tables' runner, if one runs, is there
        // too, and the switch catches the build up with it (or fences it, if it lags).
        while self.build_batch(projection, &mut client, &mut build, None, batch_events).await? {
            progress(build.progress());
        }
        self.switch_in(projection, &mut client, &mut build, batch_events).await?;
        progress(build.progress());
        Ok(u32::try_from(build.build_no).unwrap_or_default())
    }

    /// Resumes the build of `P` in progress, or begins one: its row, its schema, its tables.
    async fn begin_build<P: PgProjected>(
        &self,
        client: &mut ClientWrapper,
    ) -> Result<Build, BuildError> {
        let fail = self.fail();
        if let Some(row) = client.query_opt(BUILDING_SQL, &[&P::NAME]).await.map_err(&fail)? {
            let version = u32::try_from(row.get::<_, i32>(1)).unwrap_or_default();
            let build_no: i32 = row.get(0);
            if version == P::VERSION {
                return Ok(Build {
                    name: P::NAME,
                    build_no,
                    after: optional_cursor(&row, 2).unwrap_or(Cursor::START),
                    applied: unsigned(row.get(5)),
                    total: unsigned(row.get(6)),
                });
            }
            let reason = "superseded by a build of another version";
            self.fail_build(client, P::NAME, build_no, reason, None).await?;
            let schema = quoted(&schema_of(P::NAME, build_no));
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await
                .map_err(&fail)?;
        }
        let tx = client.transaction().await.map_err(&fail)?;
        let row = tx
            .query_one(
                "SELECT greatest((SELECT max(build_no) FROM public.projection_builds WHERE projection = $1), \
                 (SELECT max(build_no) FROM public.projection_checkpoints WHERE projection = $1), 0) + 1, \
                 (SELECT count(*) FROM public.events)",
                &[&P::NAME],
            )
            .await
            .map_err(&fail)?;
        let (build_no, total): (i32, i64) = (row.get(0), row.get(1));
        let version = i32::try_from(P::VERSION).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO public.projection_builds (projection, build_no, version, state, events_total) \
             VALUES ($1, $2, $3, 'building', $4)",
            &[&P::NAME, &build_no, &version, &total],
        )
        .await
        .map_err(&fail)?;
        let schema = schema_of(P::NAME, build_no);
        tx.batch_execute(&format!("CREATE SCHEMA {}", quoted(&schema))).await.map_err(&fail)?;
        for owned in P::TABLES {
            copy_shape(&tx, owned.name(), "public", &schema)
                .await
                .map_err(|e| write_error(e, &fail))?;
        }
        tx.commit().await.map_err(&fail)?;
        Ok(Build {
            name: P::NAME,
            build_no,
            after: Cursor::START,
            applied: 0,
            total: unsigned(total),
        })
    }

    /// Applies the next batch (up to `bound`, if given) to the build's tables with its
    /// checkpoint; `false` when there was nothing to apply.
    async fn build_batch<P: PgProjected>(
        &self,
        projection: &P,
        client: &mut ClientWrapper,
        build: &mut Build,
        bound: Option<Cursor>,
        batch_events: usize,
    ) -> Result<bool, BuildError> {
        let page = self.log().read_log(build.after, batch_events).await?;
        let events: Vec<RecordedEvent> = page
            .events
            .into_iter()
            .take_while(|event| bound.is_none_or(|bound| event.cursor <= bound))
            .collect();
        let Some(last) = events.last().map(|event| event.cursor) else { return Ok(false) };
        let fail = self.fail();
        let views = P::read_views(client, &keys_of(projection, &events)).await.map_err(
            |error| match error {
                ReadError::Driver(error) => fail(error),
                ReadError::Corrupt(reason) => StoreError::Corrupt { position: 0, reason },
            },
        )?;
        let changes = match apply_batch(projection, views, &events) {
            Ok(changes) => changes,
            Err(error) => {
                let (name, no) = (build.name, build.build_no);
                let at = Some(error.position);
                self.fail_build(client, name, no, &error.reason, at).await?;
                return Err(error.into());
            }
        };
        let count = events.len() as u64;
        let tx = client.transaction().await.map_err(&fail)?;
        let (epoch, tx_id, position) = cursor_params(last);
        let moved = tx
            .execute(
                MOVE_BUILD_SQL,
                &[&build.name, &build.build_no, &epoch, &tx_id, &position, &to_i64(count)],
            )
            .await
            .map_err(&fail)?;
        if moved != 1 {
            return Err(BuildError::Refused(format!(
                "build {} of {} is no longer building (dropped?)",
                build.build_no, build.name
            )));
        }
        P::write_changes(&tx, changes).await.map_err(|e| write_error(e, &fail))?;
        tx.commit().await.map_err(&fail)?;
        (build.after, build.applied) = (last, build.applied + count);
        Ok(true)
    }

    /// Catches the build up to the active checkpoint and swaps it in (see [`Self::try_switch`]),
    /// again while the tables' locks cannot be had at once.
    async fn switch_in<P: PgProjected>(
        &self,
        projection: &P,
        client: &mut ClientWrapper,
        build: &mut Build,
        batch_events: usize,
    ) -> Result<(), BuildError> {
        for _ in 0..SWITCH_ATTEMPTS_MAX {
            if self.try_switch(projection, client, build, batch_events).await? {
                return Ok(());
            }
        }
        Err(BuildError::Refused(format!(
            "{} could not be switched in: its tables stayed locked by readers or writers \
             through {SWITCH_ATTEMPTS_MAX} attempts; run the rebuild again to retry",
            P::NAME
        )))
    }

    /// One attempt at the switch, on a connection of its own, in one transaction: lock the
    /// active checkpoint (the active runner's next commit waits), catch the build up to it on
    /// the build's connection, take every table's lock at once (giving up after
    /// [`SWITCH_LOCK_TIMEOUT`]: a reader holding one table while waiting for another would
    /// otherwise deadlock with the switch, and either could be the one aborted), swap, move
    /// the checkpoint. `false` when the locks could not be had.
    async fn try_switch<P: PgProjected>(
        &self,
        projection: &P,
        client: &mut ClientWrapper,
        build: &mut Build,
        batch_events: usize,
    ) -> Result<bool, BuildError> {
        let mut switcher = deadpool_postgres::Object::take(self.log().client().await?);
        let fail = self.fail();
        let tx = switcher.transaction().await.map_err(&fail)?;
        tx.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            .await
            .map_err(&fail)?;
        let locked = tx
            .query_opt(&format!("{ACTIVE_SQL} FOR UPDATE"), &[&P::NAME])
            .await
            .map_err(&fail)?
            .map(|row| active_of(&row));
        if let Some(active) = locked.filter(|active| active.version == P::VERSION) {
            while build.after < active.cursor {
                let bound = Some(active.cursor);
                if !self.build_batch(projection, client, build, bound, batch_events).await? {
                    break;
                }
            }
        }
        if !lock_tables(&tx, P::TABLES).await.map_err(&fail)? {
            return Ok(false);
        }
        let active_no = match locked {
            Some(active) => active.build_no,
            None => active_build(&tx, P::NAME).await.map_err(&fail)?,
        };
        swap(&tx, P::NAME, P::TABLES, active_no, build.build_no)
            .await
            .map_err(|e| write_error(e, &fail))?;
        retire(&tx, P::NAME, locked).await.map_err(&fail)?;
        let version = i32::try_from(P::VERSION).unwrap_or(i32::MAX);
        let target = Active {
            version: P::VERSION,
            cursor: build.after,
            events: to_i64(build.applied),
            build_no: build.build_no,
        };
        point_checkpoint(&tx, P::NAME, target).await.map_err(&fail)?;
        tx.execute(
            "UPDATE public.projection_builds SET state = 'active', switched_at = now(), \
             updated_at = now(), version = $3 WHERE projection = $1 AND build_no = $2",
            &[&P::NAME, &build.build_no, &version],
        )
        .await
        .map_err(&fail)?;
        tx.commit().await.map_err(&fail)?;
        Ok(true)
    }

    /// Switches `name`'s readers back (or forward) to a retired build: its tables and its
    /// checkpoint become the active ones, the active build is retired.
    ///
    /// # Errors
    /// [`BuildError::Refused`] for a build that is not retired.
    pub async fn activate_build(
        &self,
        name: &str,
        tables: &[Owned],
        build_no: u32,
    ) -> Result<(), BuildError> {
        let mut client = self.build_lock(name).await?;
        let build_no = i32::try_from(build_no).unwrap_or(i32::MAX);
        for _ in 0..SWITCH_ATTEMPTS_MAX {
            if self.try_activate(&mut client, name, tables, build_no).await? {
                return Ok(());
            }
        }
        Err(BuildError::Refused(format!(
            "build {build_no} of {name} could not be switched in: its tables stayed locked \
             through {SWITCH_ATTEMPTS_MAX} attempts"
        )))
    }

    /// One attempt at [`Self::activate_build`]; `false` when the tables' locks could not be
    /// had at once.
    async fn try_activate(
        &self,
        client: &mut ClientWrapper,
        name: &str,
        tables: &[Owned],
        build_no: i32,
    ) -> Result<bool, BuildError> {
        let fail = self.fail();
        let tx = client.transaction().await.map_err(&fail)?;
        let row = tx
            .query_opt(
                "SELECT state, version, log_epoch, tx_id, position, events_applied \
                 FROM public.projection_builds WHERE projection = $1 AND build_no = $2",
                &[&name, &build_no],
            )
            .await
            .map_err(&fail)?;
        let Some(row) = row.filter(|row| row.get::<_, &str>(0) == "retired") else {
            return Err(BuildError::Refused(format!(
                "{name} has no retired build {build_no} to activate (see `projections status`)"
            )));
        };
        let locked = tx
            .query_opt(&format!("{ACTIVE_SQL} FOR UPDATE"), &[&name])
            .await
            .map_err(&fail)?
            .map(|row| active_of(&row));
        if !lock_tables(&tx, tables).await.map_err(&fail)? {
            return Ok(false);
        }
        let active_no = match locked {
            Some(active) => active.build_no,
            None => active_build(&tx, name).await.map_err(&fail)?,
        };
        swap(&tx, name, tables, active_no, build_no).await.map_err(|e| write_error(e, &fail))?;
        retire(&tx, name, locked).await.map_err(&fail)?;
        let target = Active {
            version: u32::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
            cursor: optional_cursor(&row, 2).unwrap_or(Cursor::START),
            events: row.get(5),
            build_no,
        };
        point_checkpoint(&tx, name, target).await.map_err(&fail)?;
        tx.execute(
            "UPDATE public.projection_builds SET state = 'active', switched_at = now(), \
             updated_at = now() WHERE projection = $1 AND build_no = $2",
            &[&name, &build_no],
        )
        .await
        .map_err(&fail)?;
        tx.commit().await.map_err(&fail)?;
        Ok(true)
    }

    /// Drops a build that is not active: its schema and tables, and its row.
    ///
    /// # Errors
    /// [`BuildError::Refused`] for the active build or one that does not exist.
    pub async fn drop_build(&self, name: &str, build_no: u32) -> Result<(), BuildError> {
        let mut client = self.build_lock(name).await?;
        let fail = self.fail();
        let build_no = i32::try_from(build_no).unwrap_or(i32::MAX);
        let tx = client.transaction().await.map_err(&fail)?;
        let state: Option<String> = tx
            .query_opt(
                "SELECT state FROM public.projection_builds WHERE projection = $1 AND build_no = $2",
                &[&name, &build_no],
            )
            .await
            .map_err(&fail)?
            .map(|row| row.get(0));
        match state.as_deref() {
            None => {
                return Err(BuildError::Refused(format!("{name} has no build {build_no}")));
            }
            Some("active") => {
                return Err(BuildError::Refused(format!(
                    "build {build_no} of {name} is active: activate another one first"
                )));
            }
            Some(_) => {}
        }
        let schema = quoted(&schema_of(name, build_no));
        tx.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .map_err(&fail)?;
        tx.execute(
            "DELETE FROM public.projection_builds WHERE projection = $1 AND build_no = $2",
            &[&name, &build_no],
        )
        .await
        .map_err(&fail)?;
        tx.commit().await.map_err(&fail)?;
        Ok(())
    }

    /// Every build of every projection, by projection and number.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn builds(&self) -> Result<Vec<BuildStatus>, StoreError> {
        let client = self.log().client().await?;
        let rows = client
            .query(
                "SELECT projection, build_no, version, state, log_epoch, tx_id, position, \
                 events_applied, events_total, error, error_position, started_at, updated_at, \
                 switched_at FROM public.projection_builds ORDER BY projection, build_no",
                &[],
            )
            .await
            .map_err(self.fail())?;
        Ok(rows.iter().map(build_status).collect())
    }

    /// Whether `P`'s active checkpoint was written by an older version of its code: its
    /// tables must be rebuilt before it can run. (Tables of a newer version are left alone: an
    /// older binary restarting during an upgrade must not rebuild over them; its runner stops
    /// at the mismatch instead.)
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn needs_rebuild<P: PgProjected>(&self) -> Result<bool, StoreError> {
        let client = self.log().client().await?;
        let row = client.query_opt(ACTIVE_SQL, &[&P::NAME]).await.map_err(self.fail())?;
        Ok(row.is_some_and(|row| active_of(&row).version < P::VERSION))
    }

    async fn fail_build(
        &self,
        client: &ClientWrapper,
        name: &str,
        build_no: i32,
        reason: &str,
        position: Option<u64>,
    ) -> Result<(), StoreError> {
        client
            .execute(
                "UPDATE public.projection_builds SET state = 'failed', error = $3, error_position = $4, \
                 updated_at = now() WHERE projection = $1 AND build_no = $2",
                &[&name, &build_no, &reason, &position.map(to_i64)],
            )
            .await
            .map_err(self.fail())?;
        Ok(())
    }
}

impl Build {
    fn progress(&self) -> BuildProgress {
        BuildProgress {
            build_no: u32::try_from(self.build_no).unwrap_or_default(),
            applied: self.applied,
            total: self.total,
        }
    }
}

/// The build whose tables are active when there is no checkpoint: the last one switched in,
/// else 0 (the tables from before any rebuild).
async fn active_build(tx: &Transaction<'_>, name: &str) -> Result<i32, tokio_postgres::Error> {
    let row = tx
        .query_one(
            "SELECT coalesce((SELECT build_no FROM public.projection_builds WHERE projection = $1 \
             AND state = 'active'), 0)",
            &[&name],
        )
        .await?;
    Ok(row.get(0))
}

/// Takes every table's lock (`public`'s: the shared tables' parents alone, then the
/// projection's own tables and partitions) in one statement, waiting at most
/// [`SWITCH_LOCK_TIMEOUT`]; `false` when they could not be had (the transaction is then
/// aborted: the caller drops it and tries again).
async fn lock_tables(
    tx: &Transaction<'_>,
    tables: &[Owned],
) -> Result<bool, tokio_postgres::Error> {
    let mut names: Vec<String> = Vec::new();
    for owned in tables {
        if let Owned::Partition { parent, .. } = owned {
            let parent = format!("ONLY public.{}", quoted(parent));
            if !names.contains(&parent) {
                names.push(parent);
            }
        }
    }
    names.extend(tables.iter().map(|owned| format!("ONLY public.{}", quoted(owned.name()))));
    let sql = format!(
        "SET LOCAL lock_timeout = '{SWITCH_LOCK_TIMEOUT}'; \
         LOCK TABLE {} IN ACCESS EXCLUSIVE MODE; SET LOCAL lock_timeout = 0",
        names.join(", ")
    );
    match tx.batch_execute(&sql).await {
        Ok(()) => Ok(true),
        Err(error)
            if error.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
        {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Moves the active tables (of build `active_no`) into their build's schema and build
/// `build_no`'s tables into `public`, partitions detached and attached again.
async fn swap(
    tx: &Transaction<'_>,
    name: &str,
    tables: &[Owned],
    active_no: i32,
    build_no: i32,
) -> Result<(), WriteError> {
    let (old, new) = (quoted(&schema_of(name, active_no)), quoted(&schema_of(name, build_no)));
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {old}")).await?;
    for owned in tables {
        let table = quoted(owned.name());
        let mut sql = String::new();
        if let Owned::Partition { parent, .. } = owned {
            sql.push_str(&format!(
                "ALTER TABLE {} DETACH PARTITION public.{table};",
                quoted(parent)
            ));
        }
        sql.push_str(&format!(
            "ALTER TABLE public.{table} SET SCHEMA {old}; ALTER TABLE {new}.{table} SET SCHEMA public;"
        ));
        if let Owned::Partition { parent, value, .. } = owned {
            sql.push_str(&format!(
                "ALTER TABLE {} ATTACH PARTITION public.{table} FOR VALUES IN ('{}');",
                quoted(parent),
                value.replace('\'', "''")
            ));
        }
        tx.batch_execute(&sql).await?;
    }
    tx.batch_execute(&format!("DROP SCHEMA {new}")).await?;
    Ok(())
}

/// Records the active build (from its locked checkpoint, if any) as retired, with the
/// checkpoint it stopped at, so that `activate` can bring it back.
async fn retire(
    tx: &Transaction<'_>,
    name: &str,
    active: Option<Active>,
) -> Result<(), tokio_postgres::Error> {
    let active_no = match active {
        Some(active) => active.build_no,
        None => active_build(tx, name).await?,
    };
    let version = active.map_or(0, |a| i32::try_from(a.version).unwrap_or(i32::MAX));
    // A build retired with no checkpoint stands at the log's start: activated again, its
    // runner applies the log from there.
    let (epoch, tx_id, position) = cursor_params(active.map_or(Cursor::START, |a| a.cursor));
    let events = active.map_or(0, |a| a.events);
    tx.execute(
        "INSERT INTO public.projection_builds (projection, build_no, version, state, log_epoch, tx_id, \
         position, events_applied, events_total) VALUES ($1, $2, $3, 'retired', $4, $5, $6, $7, $7) \
         ON CONFLICT (projection, build_no) DO UPDATE SET state = 'retired', \
         version = excluded.version, log_epoch = excluded.log_epoch, tx_id = excluded.tx_id, \
         position = excluded.position, events_applied = excluded.events_applied, \
         updated_at = now()",
        &[&name, &active_no, &version, &epoch, &tx_id, &position, &events],
    )
    .await?;
    Ok(())
}

/// Points `name`'s checkpoint at `target` (a build's; one that applied nothing stands at the
/// log's start), keeping the row and its build number, which fence every other runner.
async fn point_checkpoint(
    tx: &Transaction<'_>,
    name: &str,
    target: Active,
) -> Result<(), tokio_postgres::Error> {
    let (epoch, tx_id, position) = cursor_params(target.cursor);
    let version = i32::try_from(target.version).unwrap_or(i32::MAX);
    tx.execute(
        "INSERT INTO public.projection_checkpoints (projection, version, log_epoch, tx_id, position, \
         events_applied, kind, build_no) VALUES ($1, $2, $3, $4, $5, $6, 'projection', $7) \
         ON CONFLICT (projection) DO UPDATE SET version = excluded.version, \
         log_epoch = excluded.log_epoch, tx_id = excluded.tx_id, position = excluded.position, \
         events_applied = excluded.events_applied, build_no = excluded.build_no, \
         updated_at = now()",
        &[&name, &version, &epoch, &tx_id, &position, &target.events, &target.build_no],
    )
    .await?;
    Ok(())
}

fn cursor_params(cursor: Cursor) -> (i32, Xid8, i64) {
    (
        i32::try_from(cursor.log_epoch).unwrap_or(i32::MAX),
        Xid8(cursor.tx_id),
        to_i64(cursor.position),
    )
}

/// A cursor stored in three nullable columns from `at`.
fn optional_cursor(row: &tokio_postgres::Row, at: usize) -> Option<Cursor> {
    let epoch = row.get::<_, Option<i32>>(at)?;
    Some(Cursor {
        log_epoch: u32::try_from(epoch).unwrap_or_default(),
        tx_id: row.get::<_, Option<Xid8>>(at + 1)?.0,
        position: u64::try_from(row.get::<_, Option<i64>>(at + 2)?).unwrap_or_default(),
    })
}

fn active_of(row: &tokio_postgres::Row) -> Active {
    Active {
        cursor: crate::store::cursor_of(row),
        version: u32::try_from(row.get::<_, i32>(3)).unwrap_or_default(),
        events: row.get(4),
        build_no: row.get(5),
    }
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

fn write_error(
    error: WriteError,
    fail: &impl Fn(tokio_postgres::Error) -> StoreError,
) -> StoreError {
    match error {
        WriteError::Driver(error) => fail(error),
        WriteError::Store(error) => error,
    }
}

fn build_status(row: &tokio_postgres::Row) -> BuildStatus {
    let error = row
        .get::<_, Option<String>>(9)
        .map(|error| (error, row.get::<_, Option<i64>>(10).map(unsigned)));
    BuildStatus {
        projection: row.get(0),
        build_no: u32::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
        version: u32::try_from(row.get::<_, i32>(2)).unwrap_or_default(),
        state: row.get(3),
        cursor: optional_cursor(row, 4),
        events_applied: unsigned(row.get(7)),
        events_total: unsigned(row.get(8)),
        error,
        started_at: row.get(11),
        updated_at: row.get(12),
        switched_at: row.get(13),
    }
}
