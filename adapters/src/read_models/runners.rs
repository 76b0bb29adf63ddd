//! What the runner reconcilers read of `runner_lease_holds` (operators' and reconcilers'
//! only; never served to tenants). The projection may lag: every command is decided again
//! on the lease's stream as stored, so a lagging row leads at worst to a no-op.

use chrono::{DateTime, Utc};
use leasehold_domain::StoreError;
use uuid::Uuid;

use super::PgReadModels;

/// A runner lease as the reconcilers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerHold {
    /// The lease.
    pub lease: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Its epoch.
    pub epoch: i64,
    /// Its phase.
    pub phase: String,
    /// When it expires.
    pub expires_at: Option<DateTime<Utc>>,
}

fn hold_of(row: &tokio_postgres::Row) -> RunnerHold {
    RunnerHold {
        lease: row.get(0),
        tenant: row.get(1),
        epoch: row.get(2),
        phase: row.get(3),
        expires_at: row.get(4),
    }
}

impl PgReadModels {
    /// The leases that may be reaped at `now`: expired, neither ended nor quarantined (at
    /// most 500, the longest expired first; the next sweep takes the rest).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_leases_expired(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<RunnerHold>, StoreError> {
        let rows = self
            .query(
                "SELECT lease_id, tenant_id, epoch, phase, expires_at FROM runner_lease_holds \
                 WHERE phase NOT IN ('done', 'failed', 'quarantine') AND expires_at <= $1 \
                 ORDER BY expires_at, lease_id LIMIT 500",
                &[&now],
            )
            .await?;
        Ok(rows.iter().map(hold_of).collect())
    }

    /// Every lease bound to `node` that has not ended.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_leases_on_node(&self, node: &str) -> Result<Vec<RunnerHold>, StoreError> {
        let rows = self
            .query(
                "SELECT lease_id, tenant_id, epoch, phase, expires_at FROM runner_lease_holds \
                 WHERE node = $1 AND phase NOT IN ('done', 'failed') ORDER BY lease_id",
                &[&node],
            )
            .await?;
        Ok(rows.iter().map(hold_of).collect())
    }
}
