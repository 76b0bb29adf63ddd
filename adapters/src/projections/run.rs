//! Writing the run timeline: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::run::RunId;
use leasehold_projections::run::{RunChange, RunProjection, RunRows, RunView};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, decode, encode};
use super::shared::SharedWrites;
use super::tables::Owned;
use super::tables::workload_partitions;
use super::{Param, WriteError, execute};

const VIEWS_SQL: &str = "SELECT run_id, state FROM run_view_states WHERE run_id = ANY($1)";

const PUT_VIEWS_SQL: &str = "INSERT INTO run_view_states (run_id, tenant_id, state) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[]) \
     ON CONFLICT (run_id) DO UPDATE SET state = excluded.state";

const PUT_RUNS_SQL: &str = "INSERT INTO run_timeline (run_id, tenant_id, rental_id, \
     booking_id, status, node_id, attempts, cancel_requested, outcome, exit_code, failure, \
     cleanup, last_received_at, created_at, updated_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::uuid[], $5::text[], \
     $6::uuid[], $7::jsonb[], $8::bool[], $9::text[], $10::int4[], $11::text[], $12::text[], \
     $13::timestamptz[], $14::timestamptz[], $15::timestamptz[]) \
     ON CONFLICT (run_id) DO UPDATE SET rental_id = excluded.rental_id, \
     booking_id = excluded.booking_id, status = excluded.status, node_id = excluded.node_id, \
     attempts = excluded.attempts, cancel_requested = excluded.cancel_requested, \
     outcome = excluded.outcome, exit_code = excluded.exit_code, failure = excluded.failure, \
     cleanup = excluded.cleanup, last_received_at = excluded.last_received_at, \
     updated_at = excluded.updated_at";

impl PgProjected for RunProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("run_view_states"),
        Owned::Table("run_timeline"),
        workload_partitions!("run")[0],
        workload_partitions!("run")[1],
        workload_partitions!("run")[2],
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[RunId],
    ) -> Result<HashMap<RunId, RunView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let run = RunId(row.get(0));
            views.insert(run, decode(format!("run {}", run.0), row.get(1))?);
        }
        Ok(views)
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<RunChange>,
    ) -> Result<(), WriteError> {
        let (puts, mut shared) = gather(changes);
        write_puts(tx, &puts).await?;
        for rows in puts {
            shared.workload(rows.workload);
        }
        shared.write(tx).await
    }
}

async fn write_puts(tx: &Transaction<'_>, puts: &[RunRows]) -> Result<(), WriteError> {
    if puts.is_empty() {
        return Ok(());
    }
    let mut states = Vec::with_capacity(puts.len());
    for rows in puts {
        states.push(encode("run", &rows.view)?);
    }
    let rows: Vec<_> = puts.iter().map(|rows| &rows.row).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.run_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    execute(tx, PUT_VIEWS_SQL, &[&ids, &tenants, &states]).await?;
    let rentals: Vec<Option<Uuid>> = rows.iter().map(|r| r.rental_id).collect();
    let bookings: Vec<Option<Uuid>> = rows.iter().map(|r| r.booking_id).collect();
    let statuses: Vec<&str> = rows.iter().map(|r| r.status).collect();
    let nodes: Vec<Option<Uuid>> = rows.iter().map(|r| r.node_id).collect();
    let attempts: Vec<&serde_json::Value> = rows.iter().map(|r| &r.attempts).collect();
    let cancels: Vec<bool> = rows.iter().map(|r| r.cancel_requested).collect();
    let outcomes: Vec<Option<&str>> = rows.iter().map(|r| r.outcome).collect();
    let codes: Vec<Option<i32>> = rows.iter().map(|r| r.exit_code).collect();
    let failures: Vec<Option<&str>> = rows.iter().map(|r| r.failure.as_deref()).collect();
    let cleanups: Vec<Option<&str>> = rows.iter().map(|r| r.cleanup).collect();
    let received: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.last_received_at).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 15] = [
        &ids, &tenants, &rentals, &bookings, &statuses, &nodes, &attempts, &cancels, &outcomes,
        &codes, &failures, &cleanups, &received, &created, &updated,
    ];
    execute(tx, PUT_RUNS_SQL, &params).await
}

impl crate::replay::MemProjected for RunProjection {
    fn write_memory(
        changes: Vec<RunChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let (puts, mut shared) = gather(changes);
        for rows in &puts {
            tables.put(PUT_RUNS_SQL, &rows.row, &[])?;
        }
        for rows in puts {
            shared.workload(rows.workload);
        }
        shared.write_memory(tables)
    }
}

/// A batch's changes as both writers write them: the runs' rows, and the shared tables'.
fn gather(changes: Vec<RunChange>) -> (Vec<RunRows>, SharedWrites) {
    let mut puts = Vec::new();
    let mut shared = SharedWrites::default();
    for change in changes {
        match change {
            RunChange::Put(rows) => puts.push(*rows),
            RunChange::Quota(delta) => shared.quota(delta),
        }
    }
    (puts, shared)
}
