//! The one writer of the tables every kind's projection shares: `workloads` (one row per
//! workload of any kind) and `quota_usage` / `quota_usage_skus` (each tenant's usage, kept by
//! deltas). A kind's projection hands its rows and deltas to [`SharedWrites`] and writes its
//! own tables itself, in the same transaction. Each shared table is partitioned by kind
//! (schema/postgres/0026): a kind's rows go to its own partition (`workloads_<kind>`, ...),
//! which belongs to its projection alone and is rebuilt and switched with it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use leasehold_projections::shared::{QuotaDelta, WorkloadRow};
use uuid::Uuid;

use super::{Param, WriteError, execute};

const PUT_WORKLOADS_SQL: &str = "INSERT INTO workloads_KIND (kind, workload_id, tenant_id, status, \
     backend_name, items, created_at, updated_at) \
     SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], \
     $6::jsonb[], $7::timestamptz[], $8::timestamptz[]) \
     ON CONFLICT (kind, workload_id) DO UPDATE SET status = excluded.status, \
     backend_name = excluded.backend_name, items = excluded.items, \
     updated_at = excluded.updated_at";

const ADD_USAGE_SQL: &str = "INSERT INTO quota_usage_KIND AS u (tenant_id, kind, active_count) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) \
     ON CONFLICT (tenant_id, kind) DO UPDATE \
     SET active_count = u.active_count + excluded.active_count";

/// Quantities that came back to zero are no usage: dropped, so that the rows do not depend on
/// how the log was cut into batches (a rebuild, a replay cut it otherwise).
const DROP_ZERO_SKUS_SQL: &str = "DELETE FROM quota_usage_skus_KIND WHERE quantity = 0 \
     AND (tenant_id, sku) IN (SELECT * FROM unnest($1::text[], $2::text[]))";

const ADD_SKU_USAGE_SQL: &str = "INSERT INTO quota_usage_skus_KIND AS u (tenant_id, kind, sku, \
     quantity) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) \
     ON CONFLICT (tenant_id, kind, sku) DO UPDATE SET quantity = u.quantity + excluded.quantity";

/// A batch's writes to the shared tables, gathered so each table is written once.
#[derive(Debug, Default)]
pub(crate) struct SharedWrites {
    workloads: Vec<WorkloadRow>,
    usage: BTreeMap<(String, &'static str), i64>,
    sku_usage: BTreeMap<(String, &'static str, String), i64>,
}

impl SharedWrites {
    /// A workload's row, as of this batch.
    pub(crate) fn workload(&mut self, row: WorkloadRow) {
        self.workloads.push(row);
    }

    /// A change of a tenant's usage.
    pub(crate) fn quota(&mut self, delta: QuotaDelta) {
        *self.usage.entry((delta.tenant_id.clone(), delta.kind)).or_default() += delta.active;
        for (sku, quantity) in delta.skus {
            *self.sku_usage.entry((delta.tenant_id.clone(), delta.kind, sku)).or_default() +=
                quantity;
        }
    }

    /// Writes what was gathered, each table once.
    pub(crate) async fn write(
        self,
        tx: &deadpool_postgres::Transaction<'_>,
    ) -> Result<(), WriteError> {
        write_workloads(tx, &self.workloads).await?;
        write_usage(tx, &self.usage, &self.sku_usage).await
    }
}

async fn write_workloads(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: &[WorkloadRow],
) -> Result<(), WriteError> {
    let mut kinds: Vec<&'static str> = rows.iter().map(|r| r.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    for kind in kinds {
        let of_kind: Vec<&WorkloadRow> = rows.iter().filter(|r| r.kind == kind).collect();
        write_workloads_of(tx, kind, &of_kind).await?;
    }
    Ok(())
}

/// The table of `kind`'s part of a shared table: `table` with `KIND` replaced. Kinds are the
/// code's own constants, never input.
fn of_kind(sql: &str, kind: &str) -> String {
    debug_assert!(kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{kind}");
    sql.replace("KIND", kind)
}

async fn write_workloads_of(
    tx: &deadpool_postgres::Transaction<'_>,
    kind: &'static str,
    rows: &[&WorkloadRow],
) -> Result<(), WriteError> {
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.workload_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    let statuses: Vec<&str> = rows.iter().map(|r| r.status).collect();
    let backends: Vec<Option<&str>> = rows.iter().map(|r| r.backend_name.as_deref()).collect();
    let items: Vec<&serde_json::Value> = rows.iter().map(|r| &r.items).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 8] =
        [&kinds, &ids, &tenants, &statuses, &backends, &items, &created, &updated];
    execute(tx, &of_kind(PUT_WORKLOADS_SQL, kind), &params).await
}

async fn write_usage(
    tx: &deadpool_postgres::Transaction<'_>,
    usage: &BTreeMap<(String, &'static str), i64>,
    sku_usage: &BTreeMap<(String, &'static str, String), i64>,
) -> Result<(), WriteError> {
    let mut kinds: Vec<&'static str> = usage.keys().map(|(_, kind)| *kind).collect();
    kinds.extend(sku_usage.keys().map(|(_, kind, _)| *kind));
    kinds.sort_unstable();
    kinds.dedup();
    for kind in kinds {
        // Every tenant's kind a delta touched, even one that sums to zero: its row exists once
        // the kind was ever charged, however the batches fell.
        let usage: Vec<_> = usage.iter().filter(|((_, k), _)| *k == kind).collect();
        if !usage.is_empty() {
            let tenants: Vec<&str> = usage.iter().map(|((t, _), _)| t.as_str()).collect();
            let kinds: Vec<&str> = usage.iter().map(|((_, k), _)| *k).collect();
            let deltas: Vec<i64> = usage.iter().map(|(_, d)| **d).collect();
            execute(tx, &of_kind(ADD_USAGE_SQL, kind), &[&tenants, &kinds, &deltas]).await?;
        }
        let skus: Vec<_> =
            sku_usage.iter().filter(|((_, k, _), delta)| *k == kind && **delta != 0).collect();
        if !skus.is_empty() {
            let tenants: Vec<&str> = skus.iter().map(|((t, _, _), _)| t.as_str()).collect();
            let kinds: Vec<&str> = skus.iter().map(|((_, k, _), _)| *k).collect();
            let names: Vec<&str> = skus.iter().map(|((_, _, s), _)| s.as_str()).collect();
            let deltas: Vec<i64> = skus.iter().map(|(_, d)| **d).collect();
            let sql = of_kind(ADD_SKU_USAGE_SQL, kind);
            execute(tx, &sql, &[&tenants, &kinds, &names, &deltas]).await?;
            execute(tx, &of_kind(DROP_ZERO_SKUS_SQL, kind), &[&tenants, &names]).await?;
        }
    }
    Ok(())
}

impl SharedWrites {
    /// Writes what was gathered into the tables in memory, as [`SharedWrites::write`] writes
    /// it into PostgreSQL (through the same statements).
    pub(crate) fn write_memory(
        self,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        for row in &self.workloads {
            tables.put(PUT_WORKLOADS_SQL, row, &[])?;
        }
        for ((tenant, kind), delta) in self.usage {
            let row =
                serde_json::json!({ "tenant_id": tenant, "kind": kind, "active_count": delta });
            tables.put(ADD_USAGE_SQL, &row, &[])?;
        }
        for ((tenant, kind, sku), delta) in self.sku_usage {
            let row = serde_json::json!({ "tenant_id": tenant, "kind": kind, "sku": sku, "quantity": delta });
            tables.put(ADD_SKU_USAGE_SQL, &row, &[])?;
        }
        tables.drop_zero("quota_usage_skus");
        Ok(())
    }
}
