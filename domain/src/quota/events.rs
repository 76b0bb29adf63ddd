//! The snapshot quota's stored events. Its tenant sees its own limits and usage; nothing in
//! them is anyone else's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::QuotaLimits;
use crate::registry::{AggregateKind, EventView};
use crate::snapshot::SnapshotId;

/// Everything that can happen to a tenant's snapshot quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum QuotaEvent {
    /// An operator set the limits.
    QuotaLimitsSet { limits: QuotaLimits, at: DateTime<Utc> },
    /// A snapshot being created is counted, on an estimate of its bytes.
    QuotaReserved { snapshot: SnapshotId, bytes: u64, at: DateTime<Utc> },
    /// A snapshot's reservation was settled to its honest size.
    QuotaSettled { snapshot: SnapshotId, bytes: u64, at: DateTime<Utc> },
    /// A snapshot is no longer counted (`bytes`: what it held).
    QuotaReleased { snapshot: SnapshotId, bytes: u64, at: DateTime<Utc> },
}

crate::tagged_events!(QuotaEvent { QuotaLimitsSet, QuotaReserved, QuotaSettled, QuotaReleased });

const COUNTED: &[&str] = &["snapshot", "bytes", "at"];

/// The snapshot quota kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "tenant-quota",
    events: &[
        EventView {
            event_type: "QuotaLimitsSet",
            tenant_fields: &["limits.max_count", "limits.max_bytes", "at"],
            withheld: &[],
        },
        EventView { event_type: "QuotaReserved", tenant_fields: COUNTED, withheld: &[] },
        EventView { event_type: "QuotaSettled", tenant_fields: COUNTED, withheld: &[] },
        EventView { event_type: "QuotaReleased", tenant_fields: COUNTED, withheld: &[] },
    ],
};
