//! Writing the job history: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::runner_job::RunnerJobId;
use leasehold_projections::runner_job::{JobChange, JobProjection, JobView};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, UuidViewStates};
use super::tables::Owned;
use super::{Param, WriteError, execute};

const VIEWS: UuidViewStates = UuidViewStates { table: "runner_job_view_states", key: "job_id" };

const PUT_JOBS_SQL: &str = "INSERT INTO job_history (job_id, tenant_id, request_id, run_id, \
     lease_id, tier, status, queued_at, assigned_at, finished_at, outcome, failure_reason) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::int8[], $5::uuid[], \
     $6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[], $10::timestamptz[], \
     $11::text[], $12::text[]) \
     ON CONFLICT (job_id) DO UPDATE SET status = excluded.status, \
     finished_at = excluded.finished_at, outcome = excluded.outcome, \
     failure_reason = excluded.failure_reason";

impl PgProjected for JobProjection {
    const TABLES: &'static [Owned] =
        &[Owned::Table("runner_job_view_states"), Owned::Table("job_history")];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[RunnerJobId],
    ) -> Result<HashMap<RunnerJobId, JobView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let views = VIEWS.read(client, &ids).await?;
        Ok(views.into_iter().map(|(id, view)| (RunnerJobId(id), view)).collect())
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<JobChange>,
    ) -> Result<(), WriteError> {
        if changes.is_empty() {
            return Ok(());
        }
        let views: Vec<_> =
            changes.iter().map(|c| (c.row.job_id, c.row.tenant_id.as_str(), &c.view)).collect();
        VIEWS.write(tx, &views).await?;
        let rows: Vec<_> = changes.iter().map(|change| &change.row).collect();
        let ids: Vec<Uuid> = rows.iter().map(|r| r.job_id).collect();
        let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
        let requests: Vec<Uuid> = rows.iter().map(|r| r.request_id).collect();
        let runs: Vec<i64> = rows.iter().map(|r| r.run_id).collect();
        let leases: Vec<Uuid> = rows.iter().map(|r| r.lease_id).collect();
        let tiers: Vec<&str> = rows.iter().map(|r| r.tier.as_str()).collect();
        let statuses: Vec<&str> = rows.iter().map(|r| r.status).collect();
        let queued: Vec<DateTime<Utc>> = rows.iter().map(|r| r.queued_at).collect();
        let assigned: Vec<DateTime<Utc>> = rows.iter().map(|r| r.assigned_at).collect();
        let finished: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.finished_at).collect();
        let outcomes: Vec<Option<&str>> = rows.iter().map(|r| r.outcome).collect();
        let reasons: Vec<Option<&str>> = rows.iter().map(|r| r.failure_reason.as_deref()).collect();
        let params: [Param<'_>; 12] = [
            &ids, &tenants, &requests, &runs, &leases, &tiers, &statuses, &queued, &assigned,
            &finished, &outcomes, &reasons,
        ];
        execute(tx, PUT_JOBS_SQL, &params).await
    }
}

impl crate::replay::MemProjected for JobProjection {
    fn write_memory(
        changes: Vec<JobChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        for change in &changes {
            tables.put(PUT_JOBS_SQL, &change.row, &[])?;
        }
        Ok(())
    }
}
