//! The nodes read model: `nodes` (each node of a tenant's rentals, as its tenant sees it).
//!
//! A node's row never holds its enrollment token's hash, its fencing token or its operation
//! ids. Its facts are shown with the time Leasehold received them (`facts_received_at`: their
//! age is from it); their `observed_at` is the node's clock, kept and shown, never used to
//! order anything (rule 23). A lost node's workloads read as unobserved, not dead.

use chrono::{DateTime, Utc};
use leasehold_domain::node::{Node, NodeEvent, NodeId};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};

/// Projects node streams into the nodes read model.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeProjection;

/// One node's working state: its owner (its rental's tenant) and its aggregate state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The aggregate's state.
    pub node: Node,
}

/// A change to the nodes read model: every row derived from one node's view.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeChange {
    /// The working state, kept for the next batch.
    pub view: NodeView,
    /// `nodes`.
    pub row: NodeRow,
}

/// A row of `nodes`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0020_nodes.sql.
pub struct NodeRow {
    pub node_id: Uuid,
    pub tenant_id: String,
    pub rental_id: Uuid,
    pub generation: i64,
    pub state: &'static str,
    pub agent_version: Option<String>,
    pub facts: Option<serde_json::Value>,
    pub facts_received_at: Option<DateTime<Utc>>,
    pub enrolled_at: Option<DateTime<Utc>>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub lease_expires: Option<DateTime<Utc>>,
    pub pending_operations: i32,
    pub updated_at: DateTime<Utc>,
}

/// Revisions of what the node projection derives from its view; its version adds the
/// state's schema, so a new `Node::STATE_SCHEMA` rebuilds it.
const ROWS_REVISION: u32 = 0;

impl Projection for NodeProjection {
    const NAME: &'static str = "node_views";
    const VERSION: u32 = ROWS_REVISION + Node::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[Node::STREAM_TYPE];
    type Key = NodeId;
    type View = NodeView;
    type Change = NodeChange;

    fn key(&self, event: &RecordedEvent) -> Option<NodeId> {
        (event.stream_type.as_str() == Node::STREAM_TYPE)
            .then(|| NodeId::of_stream(&event.stream_id))
            .flatten()
    }

    fn project(
        &self,
        view: Option<&NodeView>,
        event: &RecordedEvent,
        _changes: &mut Vec<NodeChange>,
    ) -> Result<NodeView, ProjectionError> {
        let decoded = crate::projection::decoded::<NodeEvent>(Self::NAME, event)?;
        let before = view
            .cloned()
            .unwrap_or_else(|| NodeView { tenant: event.tenant_id.clone(), node: Node::initial() });
        Ok(NodeView { tenant: before.tenant, node: before.node.evolve(&decoded) })
    }

    fn put(&self, _key: &NodeId, view: &NodeView) -> NodeChange {
        NodeChange { view: view.clone(), row: row_of(view) }
    }
}

/// The row of one node, from its view.
///
/// # Panics
/// When the view has no identity: a node stream always starts with its invite.
pub fn row_of(view: &NodeView) -> NodeRow {
    let node = &view.node;
    let identity = node.identity.expect("a node stream starts with its invite");
    let facts =
        node.facts.as_ref().map(|facts| serde_json::to_value(facts).expect("facts serialize"));
    let pending = node.pending().count();
    NodeRow {
        node_id: identity.node.0,
        tenant_id: view.tenant.to_string(),
        rental_id: identity.rental.0,
        generation: i64::try_from(identity.generation).unwrap_or(i64::MAX),
        state: node.status.name(),
        agent_version: node.agent_version.as_ref().map(ToString::to_string),
        facts,
        facts_received_at: node.facts_received_at,
        enrolled_at: node.enrolled_at,
        last_heartbeat_at: node.last_heartbeat_at,
        lease_expires: node.lease_expires,
        pending_operations: i32::try_from(pending).unwrap_or(i32::MAX),
        updated_at: node.updated_at.unwrap_or_default(),
    }
}
