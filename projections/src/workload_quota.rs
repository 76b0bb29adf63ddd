//! Tenants' workload quotas as a read model: `workload_quotas`, one row per tenant and kind of
//! workload (leases, VMs, rentals, runs), each limit operators set (as events) beside what is
//! held against it, and what is held of resources no limit names. Written from the events
//! alone: a view keeps the limits and the usage, never every workload's reservation.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use leasehold_domain::workload_quota::{
    Held, WorkloadKind, WorkloadQuota, WorkloadQuotaEvent, WorkloadQuotaId,
};
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
    /// Its kind.
    pub kind: WorkloadKind,
    /// Its limits by resource.
    pub limits: BTreeMap<String, u64>,
    /// What is held, by resource.
    pub used: BTreeMap<String, u64>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
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
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of 0025_workload_quotas.sql.
pub struct QuotaRow {
    pub tenant_id: String,
    pub kind: &'static str,
    /// `[{resource, used, max}]`, by resource (`max` 0: no limit).
    pub limits: serde_json::Value,
    pub updated_at: DateTime<Utc>,
}

const ROWS_REVISION: u32 = 0;

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
        let (kind, at) = match &decoded {
            WorkloadQuotaEvent::WorkloadLimitsSet { kind, at, .. }
            | WorkloadQuotaEvent::WorkloadReserved { kind, at, .. }
            | WorkloadQuotaEvent::WorkloadReleased { kind, at, .. } => (*kind, *at),
        };
        let mut view = view.cloned().unwrap_or_else(|| QuotaView {
            tenant: event.tenant_id.clone(),
            kind,
            limits: BTreeMap::new(),
            used: BTreeMap::new(),
            updated_at: at,
        });
        match &decoded {
            WorkloadQuotaEvent::WorkloadLimitsSet { limits, .. } => {
                view.limits = limits.iter().map(|l| (l.resource.clone(), l.max)).collect();
            }
            WorkloadQuotaEvent::WorkloadReserved { held, replaced, .. } => {
                add(&mut view.used, replaced, false);
                add(&mut view.used, held, true);
            }
            WorkloadQuotaEvent::WorkloadReleased { held, .. } => add(&mut view.used, held, false),
        }
        view.updated_at = at;
        Ok(view)
    }

    fn put(&self, key: &Uuid, view: &QuotaView) -> QuotaChange {
        QuotaChange { key: *key, view: view.clone(), row: row_of(view) }
    }
}

fn add(used: &mut BTreeMap<String, u64>, held: &[Held], gained: bool) {
    for Held { resource, quantity } in held {
        let entry = used.entry(resource.clone()).or_default();
        *entry = match gained {
            true => entry.saturating_add(*quantity),
            false => entry.saturating_sub(*quantity),
        };
        if *entry == 0 {
            used.remove(resource);
        }
    }
}

/// The row of one quota: every resource limited or held, by name.
pub fn row_of(view: &QuotaView) -> QuotaRow {
    let mut resources: Vec<&String> = view.limits.keys().chain(view.used.keys()).collect();
    resources.sort();
    resources.dedup();
    let limits = resources
        .into_iter()
        .map(|resource| {
            let used = view.used.get(resource).copied().unwrap_or(0);
            let max = view.limits.get(resource).copied().unwrap_or(0);
            serde_json::json!({ "resource": resource, "used": used, "max": max })
        })
        .collect();
    QuotaRow {
        tenant_id: view.tenant.to_string(),
        kind: view.kind.name(),
        limits,
        updated_at: view.updated_at,
    }
}
