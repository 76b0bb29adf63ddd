//! The node's stored events, and what its tenant (its rental's) may see of each: never a
//! token's hash, never operation ids or the fencing token's workings. No token is ever in
//! one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{AgentVersion, NodeFacts, NodeIdentity, NodeOrder, TokenHash};
use crate::registry::{AggregateKind, EventView};
use crate::run::WorkloadObservation;
use crate::values::{OperationId, Reason};

/// Everything that can happen to a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum NodeEvent {
    /// The node of a rental's generation was invited.
    NodeInvited {
        identity: NodeIdentity,
        token_hash: TokenHash,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// It enrolled (`duplicate`: again, a resume that closed the previous session).
    NodeEnrolled {
        fencing_token: u64,
        duplicate: bool,
        agent_version: AgentVersion,
        facts: NodeFacts,
        session_expires: DateTime<Utc>,
        lease_expires: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// Its session was renewed.
    NodeSessionRenewed { session_expires: DateTime<Utc>, at: DateTime<Utc> },
    /// It beat: its lease extended (`facts`: when it reported them).
    NodeHeartbeat { lease_expires: DateTime<Utc>, facts: Option<NodeFacts>, at: DateTime<Utc> },
    /// Its lease passed: its workloads are unobserved.
    NodeLost { at: DateTime<Utc> },
    /// Its generation ended.
    NodeRetired { at: DateTime<Utc> },
    /// An operation was ordered of it.
    NodeOperationRequested {
        operation: OperationId,
        fencing_token: u64,
        order: NodeOrder,
        at: DateTime<Utc>,
    },
    /// It applied an operation (`reconciled`: its reconciliation showed it).
    NodeOperationApplied { operation: OperationId, reconciled: bool, at: DateTime<Utc> },
    /// It refused an operation.
    NodeOperationRefused { operation: OperationId, reason: Reason, at: DateTime<Utc> },
    /// Its reconciliation shows an operation never applied.
    NodeOperationNotApplied { operation: OperationId, at: DateTime<Utc> },
    /// It reported a look at a run's attempt (`received_at`: Leasehold's clock).
    NodeWorkloadObserved { observation: WorkloadObservation, received_at: DateTime<Utc> },
}

crate::tagged_events!(NodeEvent {
    NodeInvited,
    NodeEnrolled,
    NodeSessionRenewed,
    NodeHeartbeat,
    NodeLost,
    NodeRetired,
    NodeOperationRequested,
    NodeOperationApplied,
    NodeOperationRefused,
    NodeOperationNotApplied,
    NodeWorkloadObserved,
});

const HEARTBEAT: &[&str] = &[
    "lease_expires",
    "at",
    "facts.observed_at",
    "facts.os",
    "facts.architecture",
    "facts.container_runtime",
    "facts.cpu_millis",
    "facts.memory_bytes",
    "facts.disk_free_bytes",
    "facts.images[].manifest_digest",
    "facts.images[].state",
];

/// The node kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "node",
    events: &[
        view(
            "NodeInvited",
            &["identity.node", "identity.rental", "identity.generation", "expires_at", "at"],
            &["token_hash"],
        ),
        view(
            "NodeEnrolled",
            &[
                "duplicate",
                "agent_version",
                "facts.observed_at",
                "facts.os",
                "facts.architecture",
                "facts.container_runtime",
                "facts.cpu_millis",
                "facts.memory_bytes",
                "facts.disk_free_bytes",
                "facts.images[].manifest_digest",
                "facts.images[].state",
                "lease_expires",
                "at",
            ],
            &["fencing_token", "session_expires"],
        ),
        view("NodeSessionRenewed", &[], &["session_expires", "at"]),
        view("NodeHeartbeat", HEARTBEAT, &[]),
        view("NodeLost", AT, &[]),
        view("NodeRetired", AT, &[]),
        view(
            "NodeOperationRequested",
            &[
                "order.launch_workload.run",
                "order.launch_workload.attempt",
                "order.launch_workload.manifest_digest",
                "order.launch_workload.max_runtime_seconds",
                "order.stop_workload.run",
                "order.stop_workload.attempt",
                "order.prepare_image.manifest_digest",
                "at",
            ],
            &[
                "operation",
                "fencing_token",
                "order.launch_workload.booking",
                "order.stop_workload.grace_seconds",
                "order.prepare_image.unpack",
                "order.prepare_artifact",
            ],
        ),
        view("NodeOperationApplied", &["at"], &["operation", "reconciled"]),
        view("NodeOperationRefused", &["reason", "at"], &["operation"]),
        view("NodeOperationNotApplied", &["at"], &["operation"]),
        view("NodeWorkloadObserved", crate::run::OBSERVED_WORKLOAD, &[]),
    ],
};

const AT: &[&str] = &["at"];

const fn view(
    event_type: &'static str,
    tenant_fields: &'static [&'static str],
    withheld: &'static [&'static str],
) -> EventView {
    EventView { event_type, tenant_fields, withheld }
}
