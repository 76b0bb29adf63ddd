//! The lease read models: `leases` (the tenant's view), `lease_diagnostics` (operators only),
//! `releases`, `retained_leases`, `workloads` and the quota usage.
//!
//! The working view of a lease is the aggregate's own state, folded with the aggregate's own
//! `evolve`, so the read models can never disagree with what commands decide on. Every row is
//! derived from it by the pure functions below; history rows (releases) and counters (quota)
//! come from the events themselves.

use chrono::{DateTime, Utc};
use leasehold_domain::lease::{
    Lease, LeaseEvent, LeaseId, LeaseStatus, RetentionStatus, TerminalVerdict,
};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::shared::{QuotaDelta, WorkloadRow};

use crate::projection::{Projection, ProjectionError};

/// The workload kind of leases in the unified listings.
pub const LEASE_KIND: &str = leasehold_domain::workload_quota::WorkloadKind::Lease.name();

/// Projects lease streams into the lease read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaseProjection;

/// One lease's working state: its owner and its aggregate state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The aggregate's state.
    pub lease: Lease,
}

/// A change to the lease read models.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseChange {
    /// Write every row derived from one lease's view.
    Put(Box<LeaseRows>),
    /// A release began deploying.
    StartRelease(ReleaseRow),
    /// A release settled (or was superseded).
    SetRelease {
        /// The lease.
        lease_id: Uuid,
        /// The release.
        version: u32,
        /// Its new status.
        status: &'static str,
        /// Tenant-safe reason, if it failed.
        reason: Option<String>,
        /// Tenant-safe message, if it failed.
        message: Option<String>,
        /// When.
        at: DateTime<Utc>,
    },
    /// Resources a tenant holds began or stopped counting.
    Quota(QuotaDelta),
}

/// Every row derived from one lease's view.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRows {
    /// The lease's working state, kept for the next batch.
    pub view: LeaseView,
    /// `leases`.
    pub lease: LeaseRow,
    /// `lease_diagnostics`.
    pub diagnostics: DiagnosticsRow,
    /// `workloads`.
    pub workload: WorkloadRow,
    /// `retained_leases`: present while retained, removed otherwise.
    pub retained: Option<RetainedRow>,
}

/// A row of `leases`: what a tenant may see of its lease.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0004_read_models.sql.
pub struct LeaseRow {
    pub lease_id: Uuid,
    pub tenant_id: String,
    pub provider_id: Uuid,
    pub status: &'static str,
    pub chain_state: &'static str,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub items: serde_json::Value,
    pub fail_count: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub retained_until: Option<DateTime<Utc>>,
    pub restored_from: Option<Uuid>,
}

/// A row of `lease_diagnostics`: operators only.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0004_read_models.sql.
pub struct DiagnosticsRow {
    pub lease_id: Uuid,
    pub tenant_id: String,
    pub backend_name: Option<String>,
    pub last_error: Option<String>,
    pub fail_count: u32,
    pub generation: u64,
    pub budget_verdict: Option<&'static str>,
    pub consecutive_failures: Option<u32>,
    pub updated_at: DateTime<Utc>,
}

/// A row of `retained_leases`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0004_read_models.sql.
pub struct RetainedRow {
    pub lease_id: Uuid,
    pub tenant_id: String,
    pub provider_id: Uuid,
    pub status: &'static str,
    pub retained_until: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// A row of `releases` as it starts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0004_read_models.sql.
pub struct ReleaseRow {
    pub lease_id: Uuid,
    pub version: u32,
    pub tenant_id: String,
    pub payload_hash: String,
    pub created_at: DateTime<Utc>,
}

/// Revisions of what the lease projection derives from its view (rows, deltas). Its version
/// adds the schema of the state its views store, so a new `Lease::STATE_SCHEMA` (whose stored
/// views this code can no longer decode) always rebuilds it too. Both only ever rise.
// 1: a lease being released is counted in the quota usage until its release is confirmed.
const ROWS_REVISION: u32 = 1;

impl Projection for LeaseProjection {
    const NAME: &'static str = "lease_views";
    const VERSION: u32 = ROWS_REVISION + Lease::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[Lease::STREAM_TYPE];
    type Key = LeaseId;
    type View = LeaseView;
    type Change = LeaseChange;

    fn key(&self, event: &RecordedEvent) -> Option<LeaseId> {
        if event.stream_type.as_str() != Lease::STREAM_TYPE {
            return None;
        }
        let id = event.stream_id.as_str().strip_prefix("lease-")?;
        Uuid::parse_str(id).ok().map(LeaseId)
    }

    fn project(
        &self,
        view: Option<&LeaseView>,
        event: &RecordedEvent,
        changes: &mut Vec<LeaseChange>,
    ) -> Result<LeaseView, ProjectionError> {
        let decoded = crate::projection::decoded::<LeaseEvent>(Self::NAME, event)?;
        let before = view.cloned().unwrap_or_else(|| LeaseView {
            tenant: event.tenant_id.clone(),
            lease: Lease::initial(),
        });
        let after = LeaseView {
            tenant: before.tenant.clone(),
            lease: before.lease.clone().evolve(&decoded),
        };
        release_changes(&before, &decoded, changes);
        if let Some(delta) = quota_delta(&before, &after) {
            changes.push(LeaseChange::Quota(delta));
        }
        Ok(after)
    }

    fn put(&self, _key: &LeaseId, view: &LeaseView) -> LeaseChange {
        LeaseChange::Put(Box::new(rows_of(view)))
    }
}

/// History rows: a release starts with a provision request or an update, and settles with the
/// backend's report.
fn release_changes(before: &LeaseView, event: &LeaseEvent, changes: &mut Vec<LeaseChange>) {
    let lease_id = before.lease.terms.as_ref().map(|terms| terms.id.0);
    let settle = |version, status, reason: Option<String>, message: Option<String>, at| {
        lease_id.map(|lease_id| LeaseChange::SetRelease {
            lease_id,
            version,
            status,
            reason,
            message,
            at,
        })
    };
    let supersede =
        |at| before.lease.active_release.and_then(|v| settle(v, "superseded", None, None, at));
    let started = |lease: LeaseId, version, hash: &str, at| {
        LeaseChange::StartRelease(ReleaseRow {
            lease_id: lease.0,
            version,
            tenant_id: before.tenant.to_string(),
            payload_hash: hash.to_owned(),
            created_at: at,
        })
    };
    let mut push = |change: Option<LeaseChange>| changes.extend(change);
    match event {
        LeaseEvent::LeaseProvisionRequested { lease, release, payload_hash, at, .. } => {
            push(Some(started(*lease, *release, payload_hash.as_str(), *at)));
        }
        LeaseEvent::LeaseUpdateStarted { release, payload_hash, admitted_at, .. } => {
            push(
                lease_id
                    .map(|id| started(LeaseId(id), *release, payload_hash.as_str(), *admitted_at)),
            );
        }
        LeaseEvent::LeaseProvisioned { release: Some(version), at }
        | LeaseEvent::LeaseMaintenanceSucceeded { release: Some(version), at, .. } => {
            push(supersede(*at));
            push(settle(*version, "active", None, None, *at));
        }
        LeaseEvent::LeaseProvisionFailed {
            release: Some(version), reason, message, at, ..
        }
        | LeaseEvent::LeaseMaintenanceRecovered {
            release: Some(version),
            reason,
            message,
            at,
            ..
        }
        | LeaseEvent::LeaseMaintenanceFailed {
            release: Some(version), reason, message, at, ..
        } => {
            let (reason, message) = (Some(reason.to_string()), Some(message.to_string()));
            push(settle(*version, "failed", reason, message, *at));
        }
        _ => {}
    }
}

/// A lease holds its SKUs while the backend holds compute for it (until its release is
/// confirmed): its charge (`Lease::charge`), each SKU under its own name here (`sku.<SKU>` in
/// its quota).
fn held(view: &LeaseView) -> Vec<(String, i64)> {
    let Some(charge) = view.lease.charge() else { return Vec::new() };
    let skus = charge.resources().filter_map(|(resource, quantity)| {
        let sku = resource.strip_prefix("sku.")?;
        Some((sku.to_owned(), i64::try_from(quantity).unwrap_or(i64::MAX)))
    });
    skus.collect()
}

fn quota_delta(before: &LeaseView, after: &LeaseView) -> Option<QuotaDelta> {
    QuotaDelta::between(after.tenant.to_string(), LEASE_KIND, held(before), held(after))
}

/// Every row of one lease, from its view.
///
/// # Panics
/// When the view has no terms: a lease stream always starts with an event that sets them.
pub fn rows_of(view: &LeaseView) -> LeaseRows {
    let lease = &view.lease;
    let terms = lease.terms.as_ref().expect("a lease stream starts by setting its terms");
    let updated_at = lease.updated_at.unwrap_or(terms.created_at);
    let items = serde_json::to_value(terms.items.as_slice()).expect("items serialize");
    let status = lease.status.name();
    // A failed lease with no authored reason reads `Unknown` (DOMAIN.md §3 rule 3).
    let reason = match (&lease.reason, lease.status) {
        (Some(reason), _) => Some(reason.to_string()),
        (None, LeaseStatus::Failed) => Some("Unknown".to_owned()),
        (None, _) => None,
    };
    let tenant_id = view.tenant.to_string();
    let retained_until = lease.retention.and_then(|retention| retention.retained_until);
    LeaseRows {
        view: view.clone(),
        lease: LeaseRow {
            lease_id: terms.id.0,
            tenant_id: tenant_id.clone(),
            provider_id: terms.provider.0,
            status,
            chain_state: lease.chain.name(),
            reason,
            message: lease.message.as_ref().map(ToString::to_string),
            items: items.clone(),
            fail_count: lease.fail_count,
            created_at: terms.created_at,
            updated_at,
            retained_until,
            restored_from: terms.restored_from.map(|id| id.0),
        },
        diagnostics: DiagnosticsRow {
            lease_id: terms.id.0,
            tenant_id: tenant_id.clone(),
            backend_name: Some(terms.backend.to_string()),
            last_error: lease.last_error.as_ref().map(|detail| detail.as_str().to_owned()),
            fail_count: lease.fail_count,
            generation: lease.generation,
            budget_verdict: lease.terminal_budget.map(|budget| match budget.verdict {
                TerminalVerdict::Available => "available",
                TerminalVerdict::Exhausted => "exhausted",
            }),
            consecutive_failures: lease.terminal_budget.map(|budget| budget.consecutive_failures),
            updated_at,
        },
        workload: WorkloadRow {
            kind: LEASE_KIND,
            workload_id: terms.id.0,
            tenant_id: tenant_id.clone(),
            status,
            backend_name: Some(terms.backend.to_string()),
            items,
            created_at: terms.created_at,
            updated_at,
        },
        retained: lease.retention.map(|retention| RetainedRow {
            lease_id: terms.id.0,
            tenant_id,
            provider_id: terms.provider.0,
            status: match retention.status {
                RetentionStatus::Active => "active",
                RetentionStatus::Restoring { .. } => "restoring",
                RetentionStatus::Reaping => "reaping",
            },
            retained_until,
            updated_at,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use chrono::TimeZone;
    use leasehold_domain::lease::{
        LeaseItem, LeaseItems, OperatorDetail, PayloadHash, ProviderId, Reason, ServiceName, Sku,
        TenantMessage,
    };
    use leasehold_domain::{
        Cursor, EventId, EventType, Metadata, RecordedEvent, StreamId, StreamType,
    };

    use super::*;
    use crate::projection::apply_batch;
    use leasehold_domain::DomainEvent as _;

    fn at() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).single().expect("valid")
    }

    fn recorded(lease: LeaseId, version: u64, event: &LeaseEvent) -> RecordedEvent {
        RecordedEvent {
            cursor: Cursor { log_epoch: 1, tx_id: version, position: version },
            event_id: EventId::from_uuid(Uuid::from_u128(u128::from(version))),
            stream_id: lease.stream_id(),
            stream_type: StreamType::parse("lease").expect("valid"),
            tenant_id: TenantId::parse("acme").expect("valid"),
            version,
            event_type: EventType::parse(event.event_type()).expect("valid"),
            schema_version: 1,
            payload: event.to_payload(),
            metadata: Metadata::default(),
            recorded_at: at(),
            prev_hash: [0; 32],
            hash: [0; 32],
        }
    }

    fn requested(lease: LeaseId) -> LeaseEvent {
        let item = LeaseItem {
            sku: Sku::parse("sku", "gpu.h100.1x").expect("valid"),
            quantity: 3,
            service_name: Some(ServiceName::parse("s", "web").expect("valid")),
            custom_domain: None,
        };
        LeaseEvent::LeaseProvisionRequested {
            lease,
            provider: ProviderId(Uuid::nil()),
            items: LeaseItems::new(vec![item]).expect("valid"),
            payload_hash: PayloadHash::parse("h", "ab".repeat(32)).expect("valid"),
            backend: ServiceName::parse("b", "docker-1").expect("valid"),
            generation: 1,
            release: 1,
            at: at(),
            operation: None,
        }
    }

    #[test]
    fn a_batch_becomes_typed_changes_without_any_io() {
        let lease = LeaseId(Uuid::from_u128(7));
        let failed = LeaseEvent::LeaseProvisionFailed {
            reason: Reason::parse("r", "ImagePullFailed").expect("valid"),
            message: TenantMessage::parse("m", "no image").expect("valid"),
            detail: OperatorDetail::new("/var/lib/secret"),
            release: Some(1),
            at: at(),
        };
        let events = [
            recorded(lease, 1, &requested(lease)),
            recorded(lease, 2, &failed),
            recorded(lease, 3, &LeaseEvent::LeaseRejected { at: at() }),
            recorded(lease, 4, &LeaseEvent::LeaseDeprovisionRequested { generation: 2, at: at() }),
            recorded(
                lease,
                5,
                &LeaseEvent::LeaseDeprovisioned { retained: false, retained_until: None, at: at() },
            ),
        ];
        let changes = apply_batch(&LeaseProjection, HashMap::new(), &events).expect("applies");
        let quota: Vec<i64> = changes
            .iter()
            .filter_map(|c| match c {
                LeaseChange::Quota(delta) => Some(delta.active),
                _ => None,
            })
            .collect();
        assert_eq!(quota, [1, -1], "counted until its release is confirmed (rule 9)");
        assert!(matches!(&changes[0], LeaseChange::StartRelease(row) if row.version == 1));
        assert!(
            changes
                .iter()
                .any(|c| matches!(c, LeaseChange::SetRelease { status: "failed", version: 1, .. }))
        );
        let Some(LeaseChange::Put(rows)) = changes.last() else { panic!("one write per lease") };
        assert_eq!((rows.lease.status, rows.lease.chain_state), ("deprovisioned", "rejected"));
        assert_eq!(rows.lease.reason.as_deref(), Some("ImagePullFailed"));
        assert_eq!(rows.diagnostics.last_error.as_deref(), Some("/var/lib/secret"));
        assert!(!format!("{:?}", rows.lease).contains("secret"), "no detail in the tenant row");
    }

    #[test]
    fn an_event_it_cannot_read_stops_the_batch() {
        let lease = LeaseId(Uuid::from_u128(8));
        let mut event = recorded(lease, 1, &requested(lease));
        event.payload = serde_json::json!({"unexpected": true});
        let error = apply_batch(&LeaseProjection, HashMap::new(), &[event]).expect_err("refused");
        assert_eq!((error.projection, error.position), ("lease_views", 1));
    }

    #[test]
    fn events_of_other_aggregates_are_not_its_own() {
        let lease = LeaseId(Uuid::from_u128(9));
        let mut event = recorded(lease, 1, &requested(lease));
        event.stream_type = StreamType::parse("vm").expect("valid");
        event.stream_id = StreamId::parse("vm-1").expect("valid");
        assert!(apply_batch(&LeaseProjection, HashMap::new(), &[event]).expect("ok").is_empty());
    }
}
