//! `backends`: each lease backend as Leasehold last saw it (operators): its health probe and
//! its last inventory sweep, with the orphans it found. Operator detail throughout; never
//! served to tenants.

use async_graphql::{Context, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::backends::status::{BackendStatusRow, Orphan, PgBackendStatus};

use super::{require, shared};
use crate::auth::Role;
use crate::errors::ApiResult;

/// One lease backend.
#[derive(Debug, Clone, SimpleObject)]
pub struct BackendView {
    /// Its name in the backends file.
    pub name: String,
    /// Whether `GET /health` answered at the last probe (a fenced backend is never called,
    /// so never healthy). Null before the first probe.
    pub healthy: Option<bool>,
    /// Whether an operator fenced it: never called, never chosen.
    pub fenced: bool,
    /// Why the last probe found it unhealthy.
    pub error: Option<String>,
    /// Allocated CPU over total, from `GET /stats`.
    pub load: Option<f64>,
    /// Containers running, from `GET /stats`.
    pub active_containers: Option<u64>,
    /// Whether it withholds disk (routing prefers backends that do not).
    pub disk_withheld: Option<bool>,
    /// When it was last probed.
    pub probed_at: Option<DateTime<Utc>>,
    /// Its last inventory sweep.
    pub inventory: Option<InventoryView>,
}

/// A backend's last inventory sweep.
#[derive(Debug, Clone, SimpleObject)]
pub struct InventoryView {
    /// When.
    pub swept_at: DateTime<Utc>,
    /// Whether a complete listing was read; when not, everything on the backend was deferred
    /// (no budget read, no orphan released, nothing confirmed gone).
    pub complete: bool,
    /// Why it was deferred.
    pub error: Option<String>,
    /// Provisions listed at the last complete sweep.
    pub provisions: Option<u32>,
    /// Whether every listed provision named its tenant (only then is a budget read).
    pub identity_bearing: Option<bool>,
    /// Live leases placed there that the listing lacked.
    pub missing: Option<u32>,
    /// What it listed that Leasehold does not hold there.
    pub orphans: Vec<OrphanView>,
}

/// A provision a backend holds that Leasehold does not hold there.
#[derive(Debug, Clone, SimpleObject)]
pub struct OrphanView {
    /// The lease the backend names.
    pub lease: String,
    /// Its status at the backend.
    pub status: String,
    /// `unknown`, `elsewhere`, `released` or `foreign`.
    pub why: String,
    /// Whether the sweep asked the backend to release it (only when the lease's chain state
    /// is terminal).
    pub released: bool,
}

impl From<Orphan> for OrphanView {
    fn from(orphan: Orphan) -> Self {
        Self {
            lease: orphan.lease.to_string(),
            status: orphan.status,
            why: orphan.why,
            released: orphan.released,
        }
    }
}

impl From<BackendStatusRow> for BackendView {
    fn from(row: BackendStatusRow) -> Self {
        let inventory = row.swept_at.map(|swept_at| InventoryView {
            swept_at,
            complete: row.sweep_complete.unwrap_or(false),
            error: row.sweep_error,
            provisions: row.provisions,
            identity_bearing: row.identity_bearing,
            missing: row.missing,
            orphans: row.orphans.into_iter().map(OrphanView::from).collect(),
        });
        Self {
            name: row.name,
            healthy: row.healthy,
            fenced: row.fenced,
            error: row.health_error,
            load: row.cpu_load,
            active_containers: row.active_containers,
            disk_withheld: row.disk_withheld,
            probed_at: row.probed_at,
            inventory,
        }
    }
}

/// `backends`.
pub(crate) async fn statuses(ctx: &Context<'_>) -> ApiResult<Vec<BackendView>> {
    require(ctx, &[Role::Operator], "read backend status")?;
    let rows = PgBackendStatus::new(shared(ctx).store.clone()).rows().await?;
    Ok(rows.into_iter().map(BackendView::from).collect())
}
