//! How far each projection is behind the log, and how far the horizon is behind now.

use chrono::{DateTime, Utc};
use leasehold_domain::{Cursor, StoreError};

use crate::read_models::PgReadModels;
use crate::store::{HORIZON, Xid8, cursor_of, to_i64};

/// Events counted at most when measuring how far behind a projection is.
const BEHIND_COUNT_MAX: i64 = 1_000_000;

/// A projection's progress, or a reconciler's.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionStatus {
    /// Its name.
    pub name: String,
    /// `projection`, `reconciler` or `relay`.
    pub kind: String,
    /// Its version.
    pub version: u32,
    /// The cursor of the last event applied.
    pub cursor: Cursor,
    /// Events applied over its life (a relay's: published).
    pub events_applied: u64,
    /// Readable events after its cursor (counted up to 1,000,000).
    pub events_behind: u64,
    /// How long ago the oldest event it has not applied was recorded (0 when caught up).
    pub seconds_behind: f64,
    /// When it last committed.
    pub updated_at: DateTime<Utc>,
    /// Why it is failing, and at which event's position when an event could not be applied:
    /// its runner's last failure, while newer than its last commit.
    pub failure: Option<(String, Option<u64>)>,
}

/// Every checkpoint, and every projection failing before its first commit (cursor columns
/// first, then projection, version, events applied, updated at, kind, and the failure while
/// it is newer than the last commit); then every relay's (kind `relay`, version 0, events
/// published, its last failure until it publishes again).
const STATUS_SQL: &str = "SELECT coalesce(c.log_epoch, 0), coalesce(c.tx_id, '0'::xid8), \
     coalesce(c.position, 0), coalesce(c.projection, f.projection), coalesce(c.version, 0), \
     coalesce(c.events_applied, 0), coalesce(c.updated_at, f.failed_at), \
     coalesce(c.kind, 'projection') AS kind, \
     CASE WHEN c.updated_at IS NULL OR f.failed_at > c.updated_at THEN f.error END AS failure, \
     CASE WHEN c.updated_at IS NULL OR f.failed_at > c.updated_at THEN f.position END \
       AS failure_position \
     FROM projection_checkpoints c FULL JOIN projection_failures f ON f.projection = c.projection \
     UNION ALL SELECT r.log_epoch, r.tx_id, r.position, r.relay, 0, r.published, r.updated_at, \
       'relay', r.last_error, NULL::bigint FROM relay_checkpoints r \
     ORDER BY 4";

impl PgReadModels {
    /// The progress of every projection and reconciler with a checkpoint.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn projection_status(&self) -> Result<Vec<ProjectionStatus>, StoreError> {
        let rows = self.query(STATUS_SQL, &[]).await?;
        let mut statuses = Vec::with_capacity(rows.len());
        for row in rows {
            let behind = self.behind(cursor_of(&row)).await?;
            statuses.push(status_of(&row, behind));
        }
        Ok(statuses)
    }

    /// Every projection's lag, estimated without reading the log (for `/metrics`, scraped
    /// often): events behind is the log's last position taken (its identity sequence, which
    /// also counts positions of rolled-back appends) minus the checkpoint's; seconds behind is
    /// how long ago the projection last committed, while it is behind. Reads only the
    /// checkpoints and the sequence: a scrape costs the same whatever the backlog.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn projection_lag_estimates(&self) -> Result<Vec<ProjectionStatus>, StoreError> {
        let rows = self
            .query(
                "SELECT c.log_epoch, c.tx_id, c.position, c.projection, c.version, \
                 c.events_applied, c.updated_at, \
                 greatest(coalesce(pg_sequence_last_value( \
                     pg_get_serial_sequence('events', 'position')::regclass), 0) - c.position, 0), \
                 extract(epoch FROM now() - c.updated_at)::float8, c.kind \
                 FROM (SELECT log_epoch, tx_id, position, projection, version, events_applied, \
                   updated_at, kind FROM projection_checkpoints \
                   UNION ALL SELECT log_epoch, tx_id, position, relay, 0, published, \
                   updated_at, 'relay' FROM relay_checkpoints) c ORDER BY c.projection",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let events_behind = u64::try_from(row.get::<_, i64>(7)).unwrap_or_default();
                let idle = row.get::<_, Option<f64>>(8).unwrap_or(0.0).max(0.0);
                status_of(row, (events_behind, if events_behind == 0 { 0.0 } else { idle }))
            })
            .collect())
    }

    /// Events after `cursor` a whole-log reader can read now (counted up to a bound), and the
    /// age of the first of them: how far a reader at `cursor` is behind.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn behind_cursor(&self, cursor: Cursor) -> Result<(u64, f64), StoreError> {
        self.behind(cursor).await
    }

    async fn behind(&self, cursor: Cursor) -> Result<(u64, f64), StoreError> {
        let after = format!("(log_epoch, tx_id, position) > ($1, $2::xid8, $3) AND {HORIZON}");
        let sql = format!(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM events WHERE {after} LIMIT $4) x), \
             (SELECT coalesce(extract(epoch FROM now() - recorded_at)::float8, 0) FROM events \
               WHERE {after} ORDER BY events.log_epoch, events.tx_id, events.position LIMIT 1)"
        );
        let epoch = i32::try_from(cursor.log_epoch).unwrap_or(i32::MAX);
        let rows = self
            .query(
                &sql,
                &[&epoch, &Xid8(cursor.tx_id), &to_i64(cursor.position), &BEHIND_COUNT_MAX],
            )
            .await?;
        let row = rows.first().ok_or_else(|| StoreError::Database { reason: "no row".into() })?;
        let count = u64::try_from(row.get::<_, i64>(0)).unwrap_or_default();
        Ok((count, row.get::<_, Option<f64>>(1).unwrap_or(0.0).max(0.0)))
    }

    /// Each relay's publishing failures over its life (for `/metrics`).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn relay_publish_errors(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let rows = self
            .query("SELECT relay, publish_errors FROM relay_checkpoints ORDER BY relay", &[])
            .await?;
        Ok(rows
            .iter()
            .map(|row| (row.get(0), u64::try_from(row.get::<_, i64>(1)).unwrap_or_default()))
            .collect())
    }

    /// Seconds since the oldest transaction still holding a transaction id began: every
    /// whole-log reader waits for it, in every database of the cluster.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn horizon_lag_seconds(&self) -> Result<f64, StoreError> {
        let rows = self
            .query(
                "SELECT coalesce(extract(epoch FROM now() - min(xact_start))::float8, 0) \
                 FROM pg_stat_activity WHERE backend_xid IS NOT NULL",
                &[],
            )
            .await?;
        Ok(rows.first().map_or(0.0, |row| row.get::<_, f64>(0).max(0.0)))
    }
}

/// A checkpoint row (cursor columns first, then projection, version, events applied, updated
/// at, and a `kind` column) with how far behind it is: `(events, seconds)`.
fn status_of(
    row: &tokio_postgres::Row,
    (events_behind, seconds_behind): (u64, f64),
) -> ProjectionStatus {
    ProjectionStatus {
        name: row.get(3),
        kind: row.get("kind"),
        version: u32::try_from(row.get::<_, i32>(4)).unwrap_or_default(),
        cursor: cursor_of(row),
        events_applied: u64::try_from(row.get::<_, i64>(5)).unwrap_or_default(),
        events_behind,
        seconds_behind,
        updated_at: row.get(6),
        failure: row.try_get::<_, Option<String>>("failure").ok().flatten().map(|error| {
            let position = row.try_get::<_, Option<i64>>("failure_position").ok().flatten();
            (error, position.and_then(|p| u64::try_from(p).ok()))
        }),
    }
}
