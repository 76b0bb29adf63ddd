//! The rows every kind's projection contributes to the tables they share: one `workloads`
//! row per workload of any kind, and deltas of each tenant's `quota_usage`. One writer in
//! `leasehold-adapters` (`projections/shared.rs`) writes them for every projection.

use chrono::{DateTime, Utc};
use leasehold_domain::workload_quota::Charge;
use uuid::Uuid;

/// A row of `workloads`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0004_read_models.sql.
pub struct WorkloadRow {
    pub kind: &'static str,
    pub workload_id: Uuid,
    pub tenant_id: String,
    pub status: &'static str,
    pub backend_name: Option<String>,
    pub items: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What a tenant's usage gains (positive) or loses (negative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaDelta {
    /// The tenant.
    pub tenant_id: String,
    /// The workload kind.
    pub kind: &'static str,
    /// Workloads holding resources.
    pub active: i64,
    /// Quantities by SKU.
    pub skus: Vec<(String, i64)>,
}

impl QuotaDelta {
    /// The change from a workload holding `was` to holding `is` (quantities by SKU; empty:
    /// holding nothing), if there is one.
    pub fn between(
        tenant_id: String,
        kind: &'static str,
        was: Vec<(String, i64)>,
        is: Vec<(String, i64)>,
    ) -> Option<Self> {
        if was == is {
            return None;
        }
        let active = i64::from(!is.is_empty()) - i64::from(!was.is_empty());
        let mut skus = is;
        skus.extend(was.into_iter().map(|(sku, quantity)| (sku, -quantity)));
        Some(Self { tenant_id, kind, active, skus })
    }
}

/// What a workload of `kind` holds of its tenant's usage, as `quota_usage_skus` names it
/// (`<kind>.<resource>`): its aggregate's charge (`Aggregate::charge`), the one definition
/// its quota admits it on.
pub fn held_of(kind: &str, charge: Option<Charge>) -> Vec<(String, i64)> {
    let Some(charge) = charge else { return Vec::new() };
    let quantity = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    charge
        .resources()
        .map(|(resource, held)| (format!("{kind}.{resource}"), quantity(held)))
        .collect()
}
