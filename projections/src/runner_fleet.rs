//! The runner fleet's read models: `runner_capacities` (each tenant's runner capacity: its
//! limits, set by operators as events, beside what is charged against them) and
//! `runner_nodes` (each runner node's last registration, node epoch and last inventory, for
//! operators). Both are written from the aggregates' own states, folded from their streams.
//! An orphan instance the sweep gave up destroying is a `dead_letters` row (kind
//! `orphan_destroy`), as a VM orphan's is.

use chrono::{DateTime, Utc};
use leasehold_domain::runner_capacity::{RunnerCapacity, RunnerCapacityEvent, RunnerCapacityId};
use leasehold_domain::runner_node::{NodeStatus, RunnerNode, RunnerNodeEvent, RunnerNodeId};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};

/// Projects runner capacity and runner node streams.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunnerFleetProjection;

/// One stream's working state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FleetView {
    /// A tenant's runner capacity.
    Capacity {
        /// Its tenant.
        tenant: TenantId,
        /// Its state.
        capacity: RunnerCapacity,
    },
    /// A runner node (the fleet's).
    Node {
        /// Its state.
        node: Box<RunnerNode>,
        /// Its last inventory: how many leases it listed, and when.
        inventory: Option<(u32, DateTime<Utc>)>,
    },
}

/// A change: one stream's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetChange {
    /// The stream's id.
    pub key: Uuid,
    /// Its working state, kept for the next batch.
    pub view: FleetView,
    /// Its row.
    pub row: FleetRow,
}

/// The row a fleet stream writes.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetRow {
    /// `runner_capacities`.
    Capacity(CapacityRow),
    /// `runner_nodes` (none before its first registration).
    Node(Option<NodeRow>),
    /// `dead_letters`: an orphan instance the sweep gave up destroying (its view is the
    /// stream's before the event, and is not written: the stream's own change follows).
    DeadLetter(crate::vm::DeadLetterRow),
}

/// A row of `runner_capacities`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0023_runner_fleet.sql.
pub struct CapacityRow {
    pub tenant_id: String,
    pub max_vcpu: i64,
    pub max_memory_mb: i64,
    pub max_macos_slots: i32,
    /// `[{tier, max}]`.
    pub tier_limits: serde_json::Value,
    pub vcpu: i64,
    pub memory_mb: i64,
    pub macos: i32,
    /// `[{tier, leases}]`.
    pub tiers: serde_json::Value,
    pub updated_at: Option<DateTime<Utc>>,
}

/// A row of `runner_nodes`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0023_runner_fleet.sql.
pub struct NodeRow {
    pub node: String,
    pub provider: &'static str,
    pub guest_os: Vec<&'static str>,
    pub accepts: Vec<&'static str>,
    pub vcpu: i32,
    pub memory_mb: i64,
    pub node_epoch: i64,
    pub retired: bool,
    pub registered_at: Option<DateTime<Utc>>,
    pub inventory_leases: Option<i32>,
    pub inventory_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

const ROWS_REVISION: u32 = 0;

impl Projection for RunnerFleetProjection {
    const NAME: &'static str = "runner_fleet_views";
    const VERSION: u32 = ROWS_REVISION + RunnerCapacity::STATE_SCHEMA + RunnerNode::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] =
        &[RunnerCapacity::STREAM_TYPE, RunnerNode::STREAM_TYPE];
    type Key = Uuid;
    type View = FleetView;
    type Change = FleetChange;

    fn key(&self, event: &RecordedEvent) -> Option<Uuid> {
        match event.stream_type.as_str() {
            RunnerCapacity::STREAM_TYPE => {
                RunnerCapacityId::of_stream(&event.stream_id).map(|id| id.0)
            }
            RunnerNode::STREAM_TYPE => RunnerNodeId::of_stream(&event.stream_id).map(|id| id.0),
            _ => None,
        }
    }

    fn project(
        &self,
        view: Option<&FleetView>,
        event: &RecordedEvent,
        changes: &mut Vec<FleetChange>,
    ) -> Result<FleetView, ProjectionError> {
        if event.stream_type.as_str() == RunnerCapacity::STREAM_TYPE {
            let decoded = crate::projection::decoded::<RunnerCapacityEvent>(Self::NAME, event)?;
            let before = match view {
                Some(FleetView::Capacity { capacity, .. }) => capacity.clone(),
                _ => RunnerCapacity::initial(),
            };
            let tenant = event.tenant_id.clone();
            return Ok(FleetView::Capacity { tenant, capacity: before.evolve(&decoded) });
        }
        let decoded = crate::projection::decoded::<RunnerNodeEvent>(Self::NAME, event)?;
        if let (Some(view), Some(key), RunnerNodeEvent::RunnerOrphanDeadLettered { .. }) =
            (view, self.key(event), &decoded)
        {
            let row = FleetRow::DeadLetter(dead_letter(event, &decoded));
            changes.push(FleetChange { key, view: view.clone(), row });
        }
        let (before, mut inventory) = match view {
            Some(FleetView::Node { node, inventory }) => ((**node).clone(), *inventory),
            _ => (RunnerNode::initial(), None),
        };
        match &decoded {
            RunnerNodeEvent::RunnerInventoryReported { leases, at, .. } => {
                inventory = Some((u32::try_from(leases.len()).unwrap_or(u32::MAX), *at));
            }
            RunnerNodeEvent::RunnerNodeRegistered { inventory: Some(leases), at, .. } => {
                inventory = Some((u32::try_from(leases.len()).unwrap_or(u32::MAX), *at));
            }
            _ => {}
        }
        Ok(FleetView::Node { node: Box::new(before.evolve(&decoded)), inventory })
    }

    fn put(&self, key: &Uuid, view: &FleetView) -> FleetChange {
        let row = match view {
            FleetView::Capacity { tenant, capacity } => {
                FleetRow::Capacity(capacity_row(tenant, capacity))
            }
            FleetView::Node { node, inventory } => FleetRow::Node(node_row(node, *inventory)),
        };
        FleetChange { key: *key, view: view.clone(), row }
    }
}

fn capacity_row(tenant: &TenantId, capacity: &RunnerCapacity) -> CapacityRow {
    let (limits, usage) = (&capacity.limits, &capacity.usage);
    let tier_limits = limits
        .tiers
        .iter()
        .map(|limit| serde_json::json!({"tier": limit.tier.as_str(), "max": limit.max}));
    let tiers = usage
        .tiers
        .iter()
        .map(|(tier, leases)| serde_json::json!({"tier": tier.as_str(), "leases": leases}));
    CapacityRow {
        tenant_id: tenant.to_string(),
        max_vcpu: i64::try_from(limits.vcpu).unwrap_or(i64::MAX),
        max_memory_mb: i64::try_from(limits.memory_mb).unwrap_or(i64::MAX),
        max_macos_slots: i32::try_from(limits.macos_slots).unwrap_or(i32::MAX),
        tier_limits: tier_limits.collect(),
        vcpu: i64::try_from(usage.vcpu).unwrap_or(i64::MAX),
        memory_mb: i64::try_from(usage.memory_mb).unwrap_or(i64::MAX),
        macos: i32::try_from(usage.macos).unwrap_or(i32::MAX),
        tiers: tiers.collect(),
        updated_at: capacity.updated_at,
    }
}

/// The dead letter of an orphan the sweep gave up on, as the VM orphans' are kept.
fn dead_letter(event: &RecordedEvent, decoded: &RunnerNodeEvent) -> crate::vm::DeadLetterRow {
    let RunnerNodeEvent::RunnerOrphanDeadLettered { name, attempts, detail, at } = decoded else {
        unreachable!("called on a dead letter only")
    };
    crate::vm::DeadLetterRow::orphan(&event.stream_id, name, (*attempts, detail), *at)
}

fn node_row(node: &RunnerNode, inventory: Option<(u32, DateTime<Utc>)>) -> Option<NodeRow> {
    let registration = node.registration.as_ref()?;
    Some(NodeRow {
        node: registration.node.to_string(),
        provider: registration.provider.name(),
        guest_os: registration.guest_os.iter().map(|os| os.name()).collect(),
        accepts: registration.accepts.iter().map(|trust| trust.name()).collect(),
        vcpu: i32::try_from(registration.vcpu).unwrap_or(i32::MAX),
        memory_mb: i64::try_from(registration.memory_mb).unwrap_or(i64::MAX),
        node_epoch: i64::try_from(node.node_epoch).unwrap_or(i64::MAX),
        retired: node.status == NodeStatus::Retired,
        registered_at: node.registered_at,
        inventory_leases: inventory.map(|(leases, _)| i32::try_from(leases).unwrap_or(i32::MAX)),
        inventory_at: inventory.map(|(_, at)| at),
        updated_at: node.updated_at,
    })
}
