//! A runner node's stored events. Runner nodes are the fleet's: no tenant reads their
//! streams, and their views show tenants nothing (an inventory names other tenants' leases).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Registration;
use crate::registry::{AggregateKind, EventView};
use crate::runner::{RunnerLeaseId, RunnerNodeName};

/// Everything that can happen to a runner node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum RunnerNodeEvent {
    /// It registered (again): a new node epoch.
    RunnerNodeRegistered {
        registration: Registration,
        inventory: Option<Vec<RunnerLeaseId>>,
        node_epoch: u64,
        at: DateTime<Utc>,
    },
    /// Its sweep listed the leases whose instances it runs.
    RunnerInventoryReported {
        node: RunnerNodeName,
        node_epoch: u64,
        leases: Vec<RunnerLeaseId>,
        at: DateTime<Utc>,
    },
    /// An operator retired it.
    RunnerNodeRetired { at: DateTime<Utc> },
    /// The orphan sweep gave up destroying an instance on it.
    RunnerOrphanDeadLettered {
        name: String,
        attempts: u32,
        detail: crate::values::OperatorDetail,
        at: DateTime<Utc>,
    },
}

crate::tagged_events!(RunnerNodeEvent {
    RunnerNodeRegistered,
    RunnerInventoryReported,
    RunnerNodeRetired,
    RunnerOrphanDeadLettered
});

/// The runner node kind: the fleet's, shown to no tenant.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "runner-node",
    events: &[
        EventView {
            event_type: "RunnerNodeRegistered",
            tenant_fields: &[],
            withheld: &["registration", "inventory", "node_epoch", "at"],
        },
        EventView {
            event_type: "RunnerInventoryReported",
            tenant_fields: &[],
            withheld: &["node", "node_epoch", "leases", "at"],
        },
        EventView { event_type: "RunnerNodeRetired", tenant_fields: &[], withheld: &["at"] },
        EventView {
            event_type: "RunnerOrphanDeadLettered",
            tenant_fields: &[],
            withheld: &["name", "attempts", "detail", "at"],
        },
    ],
};
