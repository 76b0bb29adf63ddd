//! The `backend_status` table (migration 0012): each backend's last health probe and last
//! inventory sweep, as operators read them. Observations, not facts: overwritten by the next
//! probe or sweep and never decided from.

use chrono::{DateTime, Utc};
use leasehold_domain::StoreError;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::{PgEventStore, from_driver, from_pool};

/// A health probe's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Whether `GET /health` answered `200` (a fenced backend is never called: unhealthy).
    pub healthy: bool,
    /// Why not (operator detail).
    pub error: Option<String>,
    /// Allocated CPU over total, from `GET /stats` (when it answers).
    pub cpu_load: Option<f64>,
    /// Containers running, from `GET /stats`.
    pub active_containers: Option<u64>,
    /// Whether the backend withholds disk, from `GET /stats`.
    pub disk_withheld: Option<bool>,
}

/// A provision the backend lists that Leasehold does not hold there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    /// The lease the backend names.
    pub lease: Uuid,
    /// The status the backend lists it in.
    pub status: String,
    /// Why it is an orphan: `unknown` (no such lease in the log), `elsewhere` (placed on
    /// another backend), `released` (the lease is released, or failed for good), `retained`
    /// (held as retained, listed otherwise), `foreign` (the backend names another tenant).
    pub why: String,
    /// Whether the sweep asked the backend to release it (only on a positive terminal fact:
    /// the lease's chain state is closed, rejected or expired).
    pub released: bool,
}

/// An inventory sweep's result.
#[derive(Debug, Clone, PartialEq)]
pub enum Sweep {
    /// The backend did not answer completely: everything on it was deferred.
    Deferred {
        /// What failed (operator detail).
        error: String,
    },
    /// A complete listing was read.
    Complete {
        /// Provisions listed.
        provisions: usize,
        /// Whether every one named its tenant (only then is a budget read from it).
        identity_bearing: bool,
        /// Live leases placed here that the listing lacks (reported, never acted on).
        missing: usize,
        /// What it lists that Leasehold does not hold there.
        orphans: Vec<Orphan>,
    },
}

/// One backend's row, as operators read it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of 0012_backend_status.sql.
pub struct BackendStatusRow {
    pub name: String,
    pub fenced: bool,
    pub healthy: Option<bool>,
    pub health_error: Option<String>,
    pub cpu_load: Option<f64>,
    pub active_containers: Option<u64>,
    pub disk_withheld: Option<bool>,
    pub probed_at: Option<DateTime<Utc>>,
    pub swept_at: Option<DateTime<Utc>>,
    pub sweep_complete: Option<bool>,
    pub sweep_error: Option<String>,
    pub provisions: Option<u32>,
    pub identity_bearing: Option<bool>,
    pub missing: Option<u32>,
    pub orphans: Vec<Orphan>,
}

/// The table, over the log's pool.
#[derive(Debug, Clone)]
pub struct PgBackendStatus {
    log: PgEventStore,
}

impl PgBackendStatus {
    /// The table in the database `log` is in.
    pub fn new(log: PgEventStore) -> Self {
        Self { log }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        let endpoint = self.log.endpoint();
        self.log.pool().get().await.map_err(|error| from_pool(error, endpoint))
    }

    /// Records a probe of `backend` at `at`.
    ///
    /// # Errors
    /// A database failure.
    pub async fn record_probe(
        &self,
        (backend, fenced): (&str, bool),
        probe: &Probe,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        let containers = probe.active_containers.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        client
            .execute(
                "INSERT INTO backend_status (backend_name, fenced, healthy, health_error, \
                 cpu_load, active_containers, disk_withheld, probed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (backend_name) DO UPDATE SET fenced = excluded.fenced, \
                 healthy = excluded.healthy, health_error = excluded.health_error, \
                 cpu_load = excluded.cpu_load, active_containers = excluded.active_containers, \
                 disk_withheld = excluded.disk_withheld, probed_at = excluded.probed_at",
                &[
                    &backend,
                    &fenced,
                    &probe.healthy,
                    &probe.error,
                    &probe.cpu_load,
                    &containers,
                    &probe.disk_withheld,
                    &at,
                ],
            )
            .await
            .map_err(|error| from_driver(error, self.log.endpoint()))?;
        Ok(())
    }

    /// Records a sweep of `backend` at `at`.
    ///
    /// # Errors
    /// A database failure.
    pub async fn record_sweep(
        &self,
        backend: &str,
        sweep: &Sweep,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let fail = |error| from_driver(error, self.log.endpoint());
        match sweep {
            // A deferred sweep keeps the last complete one's figures beside its error.
            Sweep::Deferred { error } => client
                .execute(
                    "INSERT INTO backend_status (backend_name, swept_at, sweep_complete, \
                     sweep_error) VALUES ($1, $2, false, $3) \
                     ON CONFLICT (backend_name) DO UPDATE SET swept_at = excluded.swept_at, \
                     sweep_complete = false, sweep_error = excluded.sweep_error",
                    &[&backend, &at, error],
                )
                .await
                .map_err(fail)?,
            Sweep::Complete { provisions, identity_bearing, missing, orphans } => {
                let orphans = serde_json::to_value(orphans).unwrap_or_default();
                client
                    .execute(
                        "INSERT INTO backend_status (backend_name, swept_at, sweep_complete, \
                         provisions, identity_bearing, missing, orphans) \
                         VALUES ($1, $2, true, $3, $4, $5, $6) \
                         ON CONFLICT (backend_name) DO UPDATE SET swept_at = excluded.swept_at, \
                         sweep_complete = true, sweep_error = NULL, \
                         provisions = excluded.provisions, \
                         identity_bearing = excluded.identity_bearing, \
                         missing = excluded.missing, orphans = excluded.orphans",
                        &[
                            &backend,
                            &at,
                            &count(*provisions),
                            identity_bearing,
                            &count(*missing),
                            &orphans,
                        ],
                    )
                    .await
                    .map_err(fail)?
            }
        };
        Ok(())
    }

    /// Every backend's row, by name.
    ///
    /// # Errors
    /// A database failure.
    pub async fn rows(&self) -> Result<Vec<BackendStatusRow>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT backend_name, fenced, healthy, health_error, cpu_load, \
                 active_containers, disk_withheld, probed_at, swept_at, sweep_complete, \
                 sweep_error, provisions, identity_bearing, missing, orphans \
                 FROM backend_status ORDER BY backend_name",
                &[],
            )
            .await
            .map_err(|error| from_driver(error, self.log.endpoint()))?;
        let unsigned = |n: Option<i32>| n.map(|n| u32::try_from(n).unwrap_or(0));
        Ok(rows
            .iter()
            .map(|row| BackendStatusRow {
                name: row.get(0),
                fenced: row.get(1),
                healthy: row.get(2),
                health_error: row.get(3),
                cpu_load: row.get(4),
                active_containers: row
                    .get::<_, Option<i64>>(5)
                    .map(|n| u64::try_from(n).unwrap_or(0)),
                disk_withheld: row.get(6),
                probed_at: row.get(7),
                swept_at: row.get(8),
                sweep_complete: row.get(9),
                sweep_error: row.get(10),
                provisions: unsigned(row.get(11)),
                identity_bearing: row.get(12),
                missing: unsigned(row.get(13)),
                orphans: serde_json::from_value(row.get(14)).unwrap_or_default(),
            })
            .collect())
    }
}
