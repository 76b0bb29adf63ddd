//! Writing the rentals read model: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::rental::RentalId;
use leasehold_projections::rental::{RentalChange, RentalProjection, RentalRows, RentalView};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, decode, encode};
use super::shared::SharedWrites;
use super::tables::Owned;
use super::tables::workload_partitions;
use super::{Param, WriteError, execute};

const VIEWS_SQL: &str = "SELECT rental_id, state FROM rental_view_states \
     WHERE rental_id = ANY($1)";

const PUT_VIEWS_SQL: &str = "INSERT INTO rental_view_states (rental_id, tenant_id, state) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[]) \
     ON CONFLICT (rental_id) DO UPDATE SET state = excluded.state";

const PUT_RENTALS_SQL: &str = "INSERT INTO rentals (rental_id, tenant_id, connection_id, \
     offer_id, state, generation, node_id, resources, interruptible_requested, \
     interruptible_allocated, pricing, max_lifetime_seconds, observed_state, state_since, \
     observed_at, received_at, running_run, queued_runs, created_at, updated_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::int8[], $7::uuid[], $8::jsonb[], $9::bool[], $10::bool[], $11::jsonb[], $12::int8[], \
     $13::text[], $14::timestamptz[], $15::timestamptz[], $16::timestamptz[], $17::uuid[], \
     $18::int4[], $19::timestamptz[], $20::timestamptz[]) \
     ON CONFLICT (rental_id) DO UPDATE SET state = excluded.state, \
     generation = excluded.generation, node_id = excluded.node_id, \
     interruptible_allocated = excluded.interruptible_allocated, pricing = excluded.pricing, \
     observed_state = excluded.observed_state, state_since = excluded.state_since, \
     observed_at = excluded.observed_at, received_at = excluded.received_at, \
     running_run = excluded.running_run, queued_runs = excluded.queued_runs, \
     updated_at = excluded.updated_at";

impl PgProjected for RentalProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("rental_view_states"),
        Owned::Table("rentals"),
        workload_partitions!("rental")[0],
        workload_partitions!("rental")[1],
        workload_partitions!("rental")[2],
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[RentalId],
    ) -> Result<HashMap<RentalId, RentalView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let rental = RentalId(row.get(0));
            views.insert(rental, decode(format!("rental {}", rental.0), row.get(1))?);
        }
        Ok(views)
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<RentalChange>,
    ) -> Result<(), WriteError> {
        let (puts, mut shared) = gather(changes);
        write_puts(tx, &puts).await?;
        for rows in &puts {
            shared.workload(rows.workload.clone());
        }
        shared.write(tx).await
    }
}

async fn write_puts(tx: &Transaction<'_>, puts: &[RentalRows]) -> Result<(), WriteError> {
    if puts.is_empty() {
        return Ok(());
    }
    let mut states = Vec::with_capacity(puts.len());
    for rows in puts {
        states.push(encode("rental", &rows.view)?);
    }
    let rows: Vec<_> = puts.iter().map(|r| &r.rental).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.rental_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    execute(tx, PUT_VIEWS_SQL, &[&ids, &tenants, &states]).await?;
    let connections: Vec<&str> = rows.iter().map(|r| r.connection_id.as_str()).collect();
    let offers: Vec<&str> = rows.iter().map(|r| r.offer_id.as_str()).collect();
    let rental_states: Vec<&str> = rows.iter().map(|r| r.state).collect();
    let generations: Vec<i64> = rows.iter().map(|r| r.generation).collect();
    let nodes: Vec<Option<Uuid>> = rows.iter().map(|r| r.node_id).collect();
    let resources: Vec<&serde_json::Value> = rows.iter().map(|r| &r.resources).collect();
    let asked: Vec<bool> = rows.iter().map(|r| r.interruptible_requested).collect();
    let allocated: Vec<Option<bool>> = rows.iter().map(|r| r.interruptible_allocated).collect();
    let pricing: Vec<Option<&serde_json::Value>> =
        rows.iter().map(|r| r.pricing.as_ref()).collect();
    let lifetimes: Vec<i64> = rows.iter().map(|r| r.max_lifetime_seconds).collect();
    let observed: Vec<Option<&str>> = rows.iter().map(|r| r.observed_state).collect();
    let since: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.state_since).collect();
    let observed_at: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.observed_at).collect();
    let received: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.received_at).collect();
    let running: Vec<Option<Uuid>> = rows.iter().map(|r| r.running_run).collect();
    let queued: Vec<i32> = rows.iter().map(|r| r.queued_runs).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 20] = [
        &ids,
        &tenants,
        &connections,
        &offers,
        &rental_states,
        &generations,
        &nodes,
        &resources,
        &asked,
        &allocated,
        &pricing,
        &lifetimes,
        &observed,
        &since,
        &observed_at,
        &received,
        &running,
        &queued,
        &created,
        &updated,
    ];
    execute(tx, PUT_RENTALS_SQL, &params).await
}

impl crate::replay::MemProjected for RentalProjection {
    fn write_memory(
        changes: Vec<RentalChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let (puts, mut shared) = gather(changes);
        for rows in &puts {
            tables.put(PUT_RENTALS_SQL, &rows.rental, &[])?;
        }
        for rows in puts {
            shared.workload(rows.workload);
        }
        shared.write_memory(tables)
    }
}

/// A batch's changes as both writers write them: the rentals' rows, and the shared tables'.
fn gather(changes: Vec<RentalChange>) -> (Vec<RentalRows>, SharedWrites) {
    let mut puts = Vec::new();
    let mut shared = SharedWrites::default();
    for change in changes {
        match change {
            RentalChange::Put(rows) => puts.push(*rows),
            RentalChange::Quota(delta) => shared.quota(delta),
        }
    }
    (puts, shared)
}
