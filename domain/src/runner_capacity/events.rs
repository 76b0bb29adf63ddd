//! A tenant's runner capacity's stored events. Its tenant sees its own limits and usage;
//! nothing in them is anyone else's.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Demand, RunnerLimits};
use crate::registry::{AggregateKind, EventView};
use crate::runner::RunnerLeaseId;

/// Everything that can happen to a tenant's runner capacity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum RunnerCapacityEvent {
    /// An operator set the limits.
    RunnerLimitsSet { limits: RunnerLimits, at: DateTime<Utc> },
    /// A lease assigned its job is charged.
    RunnerCapacityReserved { lease: RunnerLeaseId, demand: Demand, at: DateTime<Utc> },
    /// A lease that ended is no longer charged (`demand`: what it held).
    RunnerCapacityReleased { lease: RunnerLeaseId, demand: Demand, at: DateTime<Utc> },
}

crate::tagged_events!(RunnerCapacityEvent {
    RunnerLimitsSet,
    RunnerCapacityReserved,
    RunnerCapacityReleased,
});

const CHARGED: &[&str] = &[
    "lease",
    "demand.tier",
    "demand.resources.vcpu",
    "demand.resources.memory_mb",
    "demand.macos",
    "at",
];

/// The runner capacity kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "runner-capacity",
    events: &[
        EventView {
            event_type: "RunnerLimitsSet",
            tenant_fields: &[
                "limits.vcpu",
                "limits.memory_mb",
                "limits.tiers[].tier",
                "limits.tiers[].max",
                "limits.macos_slots",
                "at",
            ],
            withheld: &[],
        },
        EventView { event_type: "RunnerCapacityReserved", tenant_fields: CHARGED, withheld: &[] },
        EventView { event_type: "RunnerCapacityReleased", tenant_fields: CHARGED, withheld: &[] },
    ],
};
