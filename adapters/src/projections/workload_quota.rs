//! Writing the workload quotas' read model: one multi-row statement per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_projections::workload_quota::{QuotaChange, QuotaView, WorkloadQuotaProjection};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, UuidViewStates};
use super::tables::Owned;
use super::{Param, WriteError, execute};

const VIEWS: UuidViewStates =
    UuidViewStates { table: "workload_quota_view_states", key: "stream_key" };

const PUT_QUOTAS_SQL: &str = "INSERT INTO workload_quotas (tenant_id, kind, limits, updated_at) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::timestamptz[]) \
     ON CONFLICT (tenant_id, kind) DO UPDATE SET limits = excluded.limits, \
     updated_at = excluded.updated_at";

impl PgProjected for WorkloadQuotaProjection {
    const TABLES: &'static [Owned] =
        &[Owned::Table("workload_quota_view_states"), Owned::Table("workload_quotas")];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[Uuid],
    ) -> Result<HashMap<Uuid, QuotaView>, ReadError> {
        Ok(VIEWS.read(client, keys).await?.into_iter().collect())
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<QuotaChange>,
    ) -> Result<(), WriteError> {
        if changes.is_empty() {
            return Ok(());
        }
        let views: Vec<_> = changes
            .iter()
            .map(|change| (change.key, change.view.tenant.as_str(), &change.view))
            .collect();
        VIEWS.write(tx, &views).await?;
        let rows: Vec<_> = changes.iter().map(|change| &change.row).collect();
        let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
        let kinds: Vec<&str> = rows.iter().map(|r| r.kind).collect();
        let limits: Vec<&serde_json::Value> = rows.iter().map(|r| &r.limits).collect();
        let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
        let params: [Param<'_>; 4] = [&tenants, &kinds, &limits, &updated];
        execute(tx, PUT_QUOTAS_SQL, &params).await
    }
}

impl crate::replay::MemProjected for WorkloadQuotaProjection {
    fn write_memory(
        changes: Vec<QuotaChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        for change in &changes {
            tables.put(PUT_QUOTAS_SQL, &change.row, &[])?;
        }
        Ok(())
    }
}
