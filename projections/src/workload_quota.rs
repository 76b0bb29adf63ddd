//! Tenants' workload quotas as a read model: `workload_quotas`, one row per tenant and kind of
//! workload (leases, VMs, rentals, runs), each limit operators set (as events) beside what is
//! held against it, and what is held of resources no limit names. Written from the quota's own
//! state, folded from its stream (its limits and usage by resource, never a row per workload).

use chrono::{DateTime, Utc};
use leasehold_domain::workload_quota::{WorkloadQuota, WorkloadQuotaEvent, WorkloadQuotaId};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};

/// Projects workload quota streams.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkloadQuotaProjection;

/// One quota's working state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaView {
    /// Its tenant.
    pub tenant: TenantId,
    /// Its state.
    pub quota: WorkloadQuota,
}

/// A change: one quota's row.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaChange {
    /// The quota's stream id.
    pub key: Uuid,
    /// Its working state, kept for the next batch.
    pub view: QuotaView,
    /// Its row.
    pub row: QuotaRow,
}

/// A row of `workload_quotas`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0025_workload_quotas.sql.
pub struct QuotaRow {
    pub tenant_id: String,
    pub kind: &'static str,
    /// `[{resource, used, max}]`, by resource (`max` 0: no limit).
    pub limits: serde_json::Value,
    pub updated_at: DateTime<Utc>,
}

// 1: the view is the quota's own state.
const ROWS_REVISION: u32 = 1;

impl Projection for WorkloadQuotaProjection {
    const NAME: &'static str = "workload_quota_views";
    const VERSION: u32 = ROWS_REVISION + WorkloadQuota::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[WorkloadQuota::STREAM_TYPE];
    type Key = Uuid;
    type View = QuotaView;
    type Change = QuotaChange;

    fn key(&self, event: &RecordedEvent) -> Option<Uuid> {
        WorkloadQuotaId::of_stream(&event.stream_id).map(|id| id.0)
    }

    fn project(
        &self,
        view: Option<&QuotaView>,
        event: &RecordedEvent,
        _changes: &mut Vec<QuotaChange>,
    ) -> Result<QuotaView, ProjectionError> {
        let decoded = crate::projection::decoded::<WorkloadQuotaEvent>(Self::NAME, event)?;
        let quota = view.map_or_else(WorkloadQuota::initial, |view| view.quota.clone());
        Ok(QuotaView { tenant: event.tenant_id.clone(), quota: quota.evolve(&decoded) })
    }

    fn put(&self, key: &Uuid, view: &QuotaView) -> QuotaChange {
        QuotaChange { key: *key, view: view.clone(), row: row_of(view) }
    }
}

/// The row of one quota: every resource limited or held, by name.
///
/// # Panics
/// For a quota no event was folded into: every quota event names its kind.
pub fn row_of(view: &QuotaView) -> QuotaRow {
    let QuotaView { tenant, quota } = view;
    let mut resources: Vec<&String> = quota.limits.keys().chain(quota.usage.keys()).collect();
    resources.sort();
    resources.dedup();
    let limits = resources
        .into_iter()
        .map(|resource| {
            let used = quota.usage.get(resource).copied().unwrap_or(0);
            let max = quota.limits.get(resource).copied().unwrap_or(0);
            serde_json::json!({ "resource": resource, "used": used, "max": max })
        })
        .collect();
    let (Some(kind), Some(updated_at)) = (quota.kind, quota.updated_at) else {
        panic!("every quota event names its kind and time")
    };
    QuotaRow { tenant_id: tenant.to_string(), kind: kind.name(), limits, updated_at }
}
