//! Writing the runner fleet's read models: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_projections::runner_fleet::{
    CapacityRow, FleetChange, FleetRow, FleetView, NodeRow, RunnerFleetProjection,
};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, UuidViewStates};
use super::tables::Owned;
use super::tables::dead_letters_of;
use super::{Param, WriteError, execute};

const VIEWS: UuidViewStates =
    UuidViewStates { table: "runner_fleet_view_states", key: "stream_key" };

const PUT_CAPACITIES_SQL: &str = "INSERT INTO runner_capacities (tenant_id, max_vcpu, \
     max_memory_mb, max_macos_slots, tier_limits, vcpu, memory_mb, macos, tiers, updated_at) \
     SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int4[], $5::jsonb[], \
     $6::int8[], $7::int8[], $8::int4[], $9::jsonb[], $10::timestamptz[]) \
     ON CONFLICT (tenant_id) DO UPDATE SET max_vcpu = excluded.max_vcpu, \
     max_memory_mb = excluded.max_memory_mb, max_macos_slots = excluded.max_macos_slots, \
     tier_limits = excluded.tier_limits, vcpu = excluded.vcpu, memory_mb = excluded.memory_mb, \
     macos = excluded.macos, tiers = excluded.tiers, updated_at = excluded.updated_at";

// One statement per node: a node's `text[]` columns do not fit `unnest` of a batch.
const PUT_NODE_SQL: &str = "INSERT INTO runner_nodes (node, provider, guest_os, accepts, vcpu, \
     memory_mb, node_epoch, retired, registered_at, inventory_leases, inventory_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (node) DO UPDATE SET provider = excluded.provider, \
     guest_os = excluded.guest_os, accepts = excluded.accepts, vcpu = excluded.vcpu, \
     memory_mb = excluded.memory_mb, node_epoch = excluded.node_epoch, \
     retired = excluded.retired, registered_at = excluded.registered_at, \
     inventory_leases = excluded.inventory_leases, inventory_at = excluded.inventory_at, \
     updated_at = excluded.updated_at";

impl PgProjected for RunnerFleetProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("runner_fleet_view_states"),
        Owned::Table("runner_capacities"),
        Owned::Table("runner_nodes"),
        dead_letters_of!("runner_fleet"),
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[Uuid],
    ) -> Result<HashMap<Uuid, FleetView>, ReadError> {
        Ok(VIEWS.read(client, keys).await?.into_iter().collect())
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<FleetChange>,
    ) -> Result<(), WriteError> {
        // A dead letter carries the view before its event; the stream's own change follows.
        let views: Vec<_> = changes
            .iter()
            .filter(|change| !matches!(change.row, FleetRow::DeadLetter(_)))
            .map(|change| (change.key, owner_of(&change.view), &change.view))
            .collect();
        VIEWS.write(tx, &views).await?;
        let mut capacities = Vec::new();
        for change in &changes {
            match &change.row {
                FleetRow::Capacity(row) => capacities.push(row),
                FleetRow::Node(Some(row)) => put_node(tx, row).await?,
                FleetRow::Node(None) => {}
                FleetRow::DeadLetter(letter) => {
                    super::vm::write_dead_letter(tx, super::vm::LetterSource::RunnerFleet, letter)
                        .await?
                }
            }
        }
        put_capacities(tx, &capacities).await
    }
}

/// Whose view it is: a capacity's tenant; the fleet's for a node.
fn owner_of(view: &FleetView) -> &str {
    match view {
        FleetView::Capacity { tenant, .. } => tenant.as_str(),
        FleetView::Node { .. } => leasehold_domain::values::fleet::FLEET_TENANT,
    }
}

async fn put_capacities(tx: &Transaction<'_>, rows: &[&CapacityRow]) -> Result<(), WriteError> {
    if rows.is_empty() {
        return Ok(());
    }
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    let max_vcpu: Vec<i64> = rows.iter().map(|r| r.max_vcpu).collect();
    let max_memory: Vec<i64> = rows.iter().map(|r| r.max_memory_mb).collect();
    let max_macos: Vec<i32> = rows.iter().map(|r| r.max_macos_slots).collect();
    let tier_limits: Vec<&serde_json::Value> = rows.iter().map(|r| &r.tier_limits).collect();
    let vcpu: Vec<i64> = rows.iter().map(|r| r.vcpu).collect();
    let memory: Vec<i64> = rows.iter().map(|r| r.memory_mb).collect();
    let macos: Vec<i32> = rows.iter().map(|r| r.macos).collect();
    let tiers: Vec<&serde_json::Value> = rows.iter().map(|r| &r.tiers).collect();
    let updated: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 10] = [
        &tenants,
        &max_vcpu,
        &max_memory,
        &max_macos,
        &tier_limits,
        &vcpu,
        &memory,
        &macos,
        &tiers,
        &updated,
    ];
    execute(tx, PUT_CAPACITIES_SQL, &params).await
}

async fn put_node(tx: &Transaction<'_>, row: &NodeRow) -> Result<(), WriteError> {
    let params: [Param<'_>; 12] = [
        &row.node,
        &row.provider,
        &row.guest_os,
        &row.accepts,
        &row.vcpu,
        &row.memory_mb,
        &row.node_epoch,
        &row.retired,
        &row.registered_at,
        &row.inventory_leases,
        &row.inventory_at,
        &row.updated_at,
    ];
    execute(tx, PUT_NODE_SQL, &params).await
}

impl crate::replay::MemProjected for RunnerFleetProjection {
    fn write_memory(
        changes: Vec<FleetChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let mut capacities = Vec::new();
        for change in &changes {
            match &change.row {
                FleetRow::Capacity(row) => capacities.push(row),
                FleetRow::Node(Some(row)) => tables.put(PUT_NODE_SQL, row, &[])?,
                FleetRow::Node(None) => {}
                FleetRow::DeadLetter(letter) => super::vm::dead_letter_memory(
                    tables,
                    super::vm::LetterSource::RunnerFleet,
                    letter,
                )?,
            }
        }
        for row in capacities {
            tables.put(PUT_CAPACITIES_SQL, row, &[])?;
        }
        Ok(())
    }
}
