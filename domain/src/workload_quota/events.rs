//! The workload quota's stored events. Its tenant sees its own limits and what its own
//! workloads hold; nothing in them is anyone else's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Held, Limit, WorkloadKind};
use crate::registry::{AggregateKind, EventView};

/// Everything that can happen to a tenant's quota of one workload kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum WorkloadQuotaEvent {
    /// An operator set the kind's limits (every one; a resource not listed is not limited).
    WorkloadLimitsSet { kind: WorkloadKind, limits: Vec<Limit>, at: DateTime<Utc> },
    /// A workload holds `held` from now on, in place of `replaced` (empty when it held
    /// nothing before).
    WorkloadReserved {
        kind: WorkloadKind,
        workload: String,
        held: Vec<Held>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        replaced: Vec<Held>,
        at: DateTime<Utc>,
    },
    /// A workload holds nothing any more (`held`: what it held).
    WorkloadReleased { kind: WorkloadKind, workload: String, held: Vec<Held>, at: DateTime<Utc> },
}

crate::tagged_events!(WorkloadQuotaEvent { WorkloadLimitsSet, WorkloadReserved, WorkloadReleased });

const RELEASED: &[&str] = &["kind", "workload", "held[].resource", "held[].quantity", "at"];
const RESERVED: &[&str] = &[
    "kind",
    "workload",
    "held[].resource",
    "held[].quantity",
    "replaced[].resource",
    "replaced[].quantity",
    "at",
];

/// The workload quota kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "workload-quota",
    events: &[
        EventView {
            event_type: "WorkloadLimitsSet",
            tenant_fields: &["kind", "limits[].resource", "limits[].max", "at"],
            withheld: &[],
        },
        EventView { event_type: "WorkloadReserved", tenant_fields: RESERVED, withheld: &[] },
        EventView { event_type: "WorkloadReleased", tenant_fields: RELEASED, withheld: &[] },
    ],
};
