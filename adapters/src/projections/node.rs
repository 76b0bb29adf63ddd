//! Writing the nodes read model: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::node::NodeId;
use leasehold_projections::node::{NodeChange, NodeProjection, NodeView};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, decode, encode};
use super::tables::Owned;
use super::{Param, WriteError, execute};

const VIEWS_SQL: &str = "SELECT node_id, state FROM node_view_states WHERE node_id = ANY($1)";

const PUT_VIEWS_SQL: &str = "INSERT INTO node_view_states (node_id, tenant_id, state) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[]) \
     ON CONFLICT (node_id) DO UPDATE SET state = excluded.state";

const PUT_NODES_SQL: &str = "INSERT INTO nodes (node_id, tenant_id, rental_id, generation, \
     state, agent_version, facts, facts_received_at, enrolled_at, last_heartbeat_at, \
     lease_expires, pending_operations, updated_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::int8[], $5::text[], \
     $6::text[], $7::jsonb[], $8::timestamptz[], $9::timestamptz[], $10::timestamptz[], \
     $11::timestamptz[], $12::int4[], $13::timestamptz[]) \
     ON CONFLICT (node_id) DO UPDATE SET state = excluded.state, \
     agent_version = excluded.agent_version, facts = excluded.facts, \
     facts_received_at = excluded.facts_received_at, enrolled_at = excluded.enrolled_at, \
     last_heartbeat_at = excluded.last_heartbeat_at, lease_expires = excluded.lease_expires, \
     pending_operations = excluded.pending_operations, updated_at = excluded.updated_at";

impl PgProjected for NodeProjection {
    const TABLES: &'static [Owned] = &[Owned::Table("node_view_states"), Owned::Table("nodes")];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[NodeId],
    ) -> Result<HashMap<NodeId, NodeView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let node = NodeId(row.get(0));
            views.insert(node, decode(format!("node {}", node.0), row.get(1))?);
        }
        Ok(views)
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<NodeChange>,
    ) -> Result<(), WriteError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut states = Vec::with_capacity(changes.len());
        for change in &changes {
            states.push(encode("node", &change.view)?);
        }
        let rows: Vec<_> = changes.iter().map(|change| &change.row).collect();
        let ids: Vec<Uuid> = rows.iter().map(|r| r.node_id).collect();
        let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
        execute(tx, PUT_VIEWS_SQL, &[&ids, &tenants, &states]).await?;
        let rentals: Vec<Uuid> = rows.iter().map(|r| r.rental_id).collect();
        let generations: Vec<i64> = rows.iter().map(|r| r.generation).collect();
        let node_states: Vec<&str> = rows.iter().map(|r| r.state).collect();
        let versions: Vec<Option<&str>> = rows.iter().map(|r| r.agent_version.as_deref()).collect();
        let facts: Vec<Option<&serde_json::Value>> =
            rows.iter().map(|r| r.facts.as_ref()).collect();
        let stamp = |get: fn(&&leasehold_projections::node::NodeRow) -> Option<DateTime<Utc>>| {
            rows.iter().map(get).collect::<Vec<_>>()
        };
        let received = stamp(|r| r.facts_received_at);
        let enrolled = stamp(|r| r.enrolled_at);
        let beats = stamp(|r| r.last_heartbeat_at);
        let leases = stamp(|r| r.lease_expires);
        let pending: Vec<i32> = rows.iter().map(|r| r.pending_operations).collect();
        let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
        let params: [Param<'_>; 13] = [
            &ids,
            &tenants,
            &rentals,
            &generations,
            &node_states,
            &versions,
            &facts,
            &received,
            &enrolled,
            &beats,
            &leases,
            &pending,
            &updated,
        ];
        execute(tx, PUT_NODES_SQL, &params).await
    }
}

impl crate::replay::MemProjected for NodeProjection {
    fn write_memory(
        changes: Vec<NodeChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        for change in &changes {
            tables.put(PUT_NODES_SQL, &change.row, &[])?;
        }
        Ok(())
    }
}
