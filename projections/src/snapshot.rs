//! The snapshot read models: `snapshot_records` (each snapshot as its tenant sees it, with the
//! operators' `last_error` in a column no tenant query selects) and `snapshot_quota_usage`
//! (each tenant's counted snapshots and bytes against its limits). One projection reads both
//! kinds, snapshots and tenant quotas, so a snapshot and its reservation, appended in one
//! transaction, reach their read models in one commit.
//!
//! The artifact index is derived from `snapshot_records` (ready rows with a digest, or a layer key
//! and arch), never a second table: nothing to rehydrate, and a row without a digest is not
//! findable rather than wrongly findable.

use chrono::{DateTime, Utc};
use leasehold_domain::quota::{QuotaEvent, SnapshotQuota};
use leasehold_domain::snapshot::{Snapshot, SnapshotEvent};
use leasehold_domain::{Aggregate, DomainEvent, RecordedEvent, StreamId, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};

/// Projects snapshot and tenant quota streams into the snapshot read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotProjection;

/// One stream's working state: its owner and its aggregate state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SnapshotView {
    /// A snapshot.
    Snapshot {
        /// The owning tenant.
        tenant: TenantId,
        /// The aggregate's state.
        snapshot: Box<Snapshot>,
    },
    /// A tenant's snapshot quota.
    Quota {
        /// The tenant.
        tenant: TenantId,
        /// The aggregate's state.
        quota: SnapshotQuota,
    },
}

/// A change to the snapshot read models.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotChange {
    /// Every row derived from one stream's view.
    Put(Box<SnapshotPut>),
    /// Retention GC kept failing to delete a snapshot: a dead letter for operators.
    DeadLetter(crate::vm::DeadLetterRow),
}

/// Every row derived from one stream's view.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPut {
    /// The stream.
    pub stream: StreamId,
    /// Its working state, kept for the next batch.
    pub view: SnapshotView,
    /// Its row.
    pub row: SnapshotRowKind,
}

/// The row a view makes.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotRowKind {
    /// A row of `snapshot_records`.
    Snapshot(Box<SnapshotRow>),
    /// A row of `snapshot_quota_usage`.
    Quota(QuotaRow),
}

/// A row of `snapshot_records`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0017_snapshots.sql.
pub struct SnapshotRow {
    pub snapshot_id: Uuid,
    pub tenant_id: String,
    pub vm_id: Uuid,
    pub task_id: String,
    pub host_id: String,
    pub state: &'static str,
    pub mode: &'static str,
    pub requested: &'static str,
    pub kind: Option<&'static str>,
    pub parent_snapshot_id: Option<Uuid>,
    pub layer_key: Option<String>,
    pub arch: String,
    pub digest: Option<String>,
    pub name: Option<String>,
    pub size_bytes: i64,
    pub retention_until: Option<DateTime<Utc>>,
    pub exports: serde_json::Value,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_used: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// The host store's reference, once written (0018; never shown to tenants).
    pub store_ref: Option<String>,
}

/// A row of `snapshot_quota_usage`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0017_snapshots.sql.
pub struct QuotaRow {
    pub tenant_id: String,
    pub count: i64,
    pub bytes: i64,
    pub max_count: i64,
    pub max_bytes: i64,
    pub updated_at: Option<DateTime<Utc>>,
}

const ROWS_REVISION: u32 = 0;

impl Projection for SnapshotProjection {
    const NAME: &'static str = "snapshot_views";
    const VERSION: u32 = ROWS_REVISION + Snapshot::STATE_SCHEMA + SnapshotQuota::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] =
        &[Snapshot::STREAM_TYPE, SnapshotQuota::STREAM_TYPE];
    type Key = StreamId;
    type View = SnapshotView;
    type Change = SnapshotChange;

    fn key(&self, event: &RecordedEvent) -> Option<StreamId> {
        Self::STREAM_TYPES.contains(&event.stream_type.as_str()).then(|| event.stream_id.clone())
    }

    fn project(
        &self,
        view: Option<&SnapshotView>,
        event: &RecordedEvent,
        changes: &mut Vec<SnapshotChange>,
    ) -> Result<SnapshotView, ProjectionError> {
        let fail = |reason: String| ProjectionError {
            projection: Self::NAME,
            position: event.cursor.position,
            reason,
        };
        let tenant = event.tenant_id.clone();
        let (event_type, payload) = (event.event_type.as_str(), &event.payload);
        if event.stream_type.as_str() == Snapshot::STREAM_TYPE {
            let decoded = SnapshotEvent::from_stored(event_type, payload)
                .map_err(|error| fail(error.to_string()))?;
            let before = match view {
                Some(SnapshotView::Snapshot { snapshot, .. }) => (**snapshot).clone(),
                _ => Snapshot::initial(),
            };
            if let SnapshotEvent::SnapshotGcDeadLettered { failures, at } = &decoded {
                changes.push(SnapshotChange::DeadLetter(gc_dead_letter(
                    &before, event, *failures, *at,
                )));
            }
            Ok(SnapshotView::Snapshot { tenant, snapshot: Box::new(before.evolve(&decoded)) })
        } else {
            let decoded = QuotaEvent::from_stored(event_type, payload)
                .map_err(|error| fail(error.to_string()))?;
            let before = match view {
                Some(SnapshotView::Quota { quota, .. }) => quota.clone(),
                _ => SnapshotQuota::initial(),
            };
            Ok(SnapshotView::Quota { tenant, quota: before.evolve(&decoded) })
        }
    }

    fn put(&self, key: &StreamId, view: &SnapshotView) -> SnapshotChange {
        let row = match view {
            SnapshotView::Snapshot { tenant, snapshot } => {
                SnapshotRowKind::Snapshot(Box::new(snapshot_row(tenant, snapshot)))
            }
            SnapshotView::Quota { tenant, quota } => {
                SnapshotRowKind::Quota(quota_row(tenant, quota))
            }
        };
        SnapshotChange::Put(Box::new(SnapshotPut { stream: key.clone(), view: view.clone(), row }))
    }
}

/// The dead letter of a snapshot retention GC failed to delete `failures` times in a row.
fn gc_dead_letter(
    snapshot: &Snapshot,
    event: &RecordedEvent,
    failures: u32,
    at: DateTime<Utc>,
) -> crate::vm::DeadLetterRow {
    let detail = snapshot.last_error.as_ref().map(|detail| detail.as_str());
    crate::vm::DeadLetterRow {
        kind: "snapshot_gc",
        entity_id: event.stream_id.as_str().to_owned(),
        task_id: snapshot.terms.as_ref().map(|terms| terms.task.to_string()),
        reason: format!("retention GC failed to delete it {failures} times in a row"),
        payload: serde_json::json!({ "detail": detail, "failures": failures }),
        at,
    }
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The `snapshot_records` row of a snapshot.
///
/// # Panics
/// When the snapshot was never requested: a snapshot stream starts with its request.
pub fn snapshot_row(tenant: &TenantId, snapshot: &Snapshot) -> SnapshotRow {
    let terms = snapshot.terms.as_ref().expect("a snapshot stream starts with its request");
    let written = snapshot.written.as_ref();
    SnapshotRow {
        snapshot_id: terms.snapshot.0,
        tenant_id: tenant.to_string(),
        vm_id: terms.vm.0,
        task_id: terms.task.to_string(),
        host_id: terms.host.to_string(),
        state: snapshot.status.name(),
        mode: terms.mode.name(),
        requested: terms.requested.name(),
        kind: written.map(|written| written.kind.name()),
        parent_snapshot_id: terms.parent.map(|parent| parent.0),
        layer_key: terms.layer_key.as_ref().map(ToString::to_string),
        arch: terms.arch.to_string(),
        digest: written.and_then(|written| written.digest.as_ref()).map(ToString::to_string),
        name: terms.name.as_ref().map(ToString::to_string),
        size_bytes: to_i64(snapshot.size_bytes),
        retention_until: terms.retention_until,
        exports: serde_json::Value::Array(
            snapshot
                .exports
                .iter()
                .map(|export| {
                    serde_json::json!({
                        "destination": export.destination.as_str(),
                        "status": export.status.name(),
                        "requested_at": export.requested_at,
                        "updated_at": export.updated_at,
                    })
                })
                .collect(),
        ),
        last_error: snapshot.last_error.as_ref().map(|detail| detail.as_str().to_owned()),
        created_at: snapshot.created_at.unwrap_or_default(),
        last_used: snapshot.last_used,
        updated_at: snapshot.updated_at.unwrap_or_default(),
        store_ref: written.map(|written| written.store_ref.to_string()),
    }
}

/// The `snapshot_quota_usage` row of a tenant's quota.
pub fn quota_row(tenant: &TenantId, quota: &SnapshotQuota) -> QuotaRow {
    QuotaRow {
        tenant_id: tenant.to_string(),
        count: i64::from(quota.usage.count),
        bytes: to_i64(quota.usage.bytes),
        max_count: i64::from(quota.limits.max_count),
        max_bytes: to_i64(quota.limits.max_bytes),
        updated_at: quota.updated_at,
    }
}
