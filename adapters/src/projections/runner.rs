//! Writing the runner lease read models: one multi-row statement per table per batch.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::runner::RunnerLeaseId;
use leasehold_projections::runner::{
    RunnerChange, RunnerProjection, RunnerRows, RunnerView, UsageDelta,
};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, UuidViewStates};
use super::shared::SharedWrites;
use super::tables::Owned;
use super::tables::workload_partitions;
use super::{Param, WriteError, execute};

const VIEWS: UuidViewStates = UuidViewStates { table: "runner_lease_view_states", key: "lease_id" };

const PUT_LEASES_SQL: &str = "INSERT INTO runner_leases (lease_id, tenant_id, tier, trust, \
     guest_os, vcpu, memory_mb, providers, phase, job_request, job_run, outcome, \
     failure_reason, teardown, expires_at, held_since, created_at, updated_at) \
     SELECT l.lease_id, l.tenant_id, l.tier, l.trust, l.guest_os, l.vcpu, l.memory_mb, \
     string_to_array(l.providers, ','), l.phase, l.job_request, l.job_run, l.outcome, \
     l.failure_reason, l.teardown, l.expires_at, l.held_since, l.created_at, l.updated_at \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[], \
     $7::int8[], $8::text[], $9::text[], $10::uuid[], $11::int8[], $12::text[], $13::text[], \
     $14::text[], $15::timestamptz[], $16::timestamptz[], $17::timestamptz[], \
     $18::timestamptz[]) AS l(lease_id, tenant_id, tier, trust, guest_os, vcpu, memory_mb, \
     providers, phase, job_request, job_run, outcome, failure_reason, teardown, expires_at, \
     held_since, created_at, updated_at) \
     ON CONFLICT (lease_id) DO UPDATE SET phase = excluded.phase, \
     job_request = excluded.job_request, job_run = excluded.job_run, \
     outcome = excluded.outcome, failure_reason = excluded.failure_reason, \
     teardown = excluded.teardown, expires_at = excluded.expires_at, \
     held_since = excluded.held_since, updated_at = excluded.updated_at";

const PUT_HOLDS_SQL: &str = "INSERT INTO runner_lease_holds (lease_id, tenant_id, node, epoch, \
     instance, phase, expires_at, updated_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int8[], $5::text[], \
     $6::text[], $7::timestamptz[], $8::timestamptz[]) \
     ON CONFLICT (lease_id) DO UPDATE SET node = excluded.node, epoch = excluded.epoch, \
     instance = excluded.instance, phase = excluded.phase, expires_at = excluded.expires_at, \
     updated_at = excluded.updated_at";

/// Usage that came back to zero is no usage: dropped, so that the rows do not depend on how
/// the log was cut into batches (a rebuild, a replay cut it otherwise).
const DROP_ZERO_USAGE_SQL: &str = "DELETE FROM runner_usage WHERE leases = 0 AND vcpu = 0 \
     AND memory_mb = 0 AND (tier, node) IN (SELECT * FROM unnest($1::text[], $2::text[]))";

const ADD_USAGE_SQL: &str = "INSERT INTO runner_usage (tier, node, leases, vcpu, memory_mb) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[]) \
     ON CONFLICT (tier, node) DO UPDATE SET leases = runner_usage.leases + excluded.leases, \
     vcpu = runner_usage.vcpu + excluded.vcpu, \
     memory_mb = runner_usage.memory_mb + excluded.memory_mb";

impl PgProjected for RunnerProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("runner_lease_view_states"),
        Owned::Table("runner_leases"),
        Owned::Table("runner_lease_holds"),
        Owned::Table("runner_usage"),
        workload_partitions!("runner")[0],
        workload_partitions!("runner")[1],
        workload_partitions!("runner")[2],
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[RunnerLeaseId],
    ) -> Result<HashMap<RunnerLeaseId, RunnerView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let views = VIEWS.read(client, &ids).await?;
        Ok(views.into_iter().map(|(id, view)| (RunnerLeaseId(id), view)).collect())
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<RunnerChange>,
    ) -> Result<(), WriteError> {
        let (puts, mut shared, usage) = gather(changes);
        write_puts(tx, &puts).await?;
        write_usage(tx, &usage).await?;
        for rows in puts {
            shared.workload(rows.workload);
        }
        shared.write(tx).await
    }
}

async fn write_puts(tx: &Transaction<'_>, puts: &[RunnerRows]) -> Result<(), WriteError> {
    if puts.is_empty() {
        return Ok(());
    }
    let views: Vec<_> = puts
        .iter()
        .map(|rows| (rows.row.lease_id, rows.row.tenant_id.as_str(), &rows.view))
        .collect();
    VIEWS.write(tx, &views).await?;
    let rows: Vec<_> = puts.iter().map(|rows| &rows.row).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.lease_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    let tiers: Vec<&str> = rows.iter().map(|r| r.tier.as_str()).collect();
    let trusts: Vec<&str> = rows.iter().map(|r| r.trust).collect();
    let guests: Vec<&str> = rows.iter().map(|r| r.guest_os).collect();
    let vcpus: Vec<i32> = rows.iter().map(|r| r.vcpu).collect();
    let memory: Vec<i64> = rows.iter().map(|r| r.memory_mb).collect();
    // Provider names are lower-case words: joined by ',' for the multi-row statement.
    let providers: Vec<String> = rows.iter().map(|r| r.providers.join(",")).collect();
    let phases: Vec<&str> = rows.iter().map(|r| r.phase).collect();
    let requests: Vec<Option<Uuid>> = rows.iter().map(|r| r.job_request).collect();
    let runs: Vec<Option<i64>> = rows.iter().map(|r| r.job_run).collect();
    let outcomes: Vec<Option<&str>> = rows.iter().map(|r| r.outcome).collect();
    let reasons: Vec<Option<&str>> = rows.iter().map(|r| r.failure_reason.as_deref()).collect();
    let teardowns: Vec<Option<&str>> = rows.iter().map(|r| r.teardown).collect();
    let expires: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.expires_at).collect();
    let held: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.held_since).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 18] = [
        &ids, &tenants, &tiers, &trusts, &guests, &vcpus, &memory, &providers, &phases, &requests,
        &runs, &outcomes, &reasons, &teardowns, &expires, &held, &created, &updated,
    ];
    execute(tx, PUT_LEASES_SQL, &params).await?;
    write_holds(tx, puts).await
}

async fn write_holds(tx: &Transaction<'_>, puts: &[RunnerRows]) -> Result<(), WriteError> {
    let holds: Vec<_> = puts.iter().map(|rows| &rows.hold).collect();
    let ids: Vec<Uuid> = holds.iter().map(|h| h.lease_id).collect();
    let tenants: Vec<&str> = holds.iter().map(|h| h.tenant_id.as_str()).collect();
    let nodes: Vec<Option<&str>> = holds.iter().map(|h| h.node.as_deref()).collect();
    let epochs: Vec<i64> = holds.iter().map(|h| h.epoch).collect();
    let instances: Vec<Option<&str>> = holds.iter().map(|h| h.instance.as_deref()).collect();
    let phases: Vec<&str> = holds.iter().map(|h| h.phase).collect();
    let expires: Vec<Option<DateTime<Utc>>> = holds.iter().map(|h| h.expires_at).collect();
    let updated: Vec<DateTime<Utc>> = holds.iter().map(|h| h.updated_at).collect();
    let params: [Param<'_>; 8] =
        [&ids, &tenants, &nodes, &epochs, &instances, &phases, &expires, &updated];
    execute(tx, PUT_HOLDS_SQL, &params).await
}

async fn write_usage(tx: &Transaction<'_>, usage: &Usage) -> Result<(), WriteError> {
    let usage: Vec<_> = usage.iter().filter(|(_, sums)| **sums != [0; 3]).collect();
    if usage.is_empty() {
        return Ok(());
    }
    let tiers: Vec<&str> = usage.iter().map(|((tier, _), _)| tier.as_str()).collect();
    let nodes: Vec<&str> = usage.iter().map(|((_, node), _)| node.as_str()).collect();
    let leases: Vec<i64> = usage.iter().map(|(_, sums)| sums[0]).collect();
    let vcpus: Vec<i64> = usage.iter().map(|(_, sums)| sums[1]).collect();
    let memory: Vec<i64> = usage.iter().map(|(_, sums)| sums[2]).collect();
    execute(tx, ADD_USAGE_SQL, &[&tiers, &nodes, &leases, &vcpus, &memory]).await?;
    execute(tx, DROP_ZERO_USAGE_SQL, &[&tiers, &nodes]).await
}

impl crate::replay::MemProjected for RunnerProjection {
    fn write_memory(
        changes: Vec<RunnerChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let (puts, mut shared, usage) = gather(changes);
        for rows in &puts {
            tables.put(PUT_LEASES_SQL, &rows.row, &[])?;
            tables.put(PUT_HOLDS_SQL, &rows.hold, &[])?;
        }
        for ((tier, node), [leases, vcpu, memory_mb]) in usage {
            let row = serde_json::json!({
                "tier": tier, "node": node, "leases": leases, "vcpu": vcpu, "memory_mb": memory_mb,
            });
            tables.put(ADD_USAGE_SQL, &row, &[])?;
        }
        tables.drop_zero("runner_usage");
        for rows in puts {
            shared.workload(rows.workload);
        }
        shared.write_memory(tables)
    }
}

/// Usage by (tier, node): leases, vCPUs, memory.
type Usage = BTreeMap<(String, String), [i64; 3]>;

/// A batch's changes as both writers write them: the leases' rows, the shared tables', and
/// the usage each (tier, node) gains or loses in all.
fn gather(changes: Vec<RunnerChange>) -> (Vec<RunnerRows>, SharedWrites, Usage) {
    let mut puts = Vec::new();
    let mut shared = SharedWrites::default();
    let mut usage = Usage::new();
    for change in changes {
        match change {
            RunnerChange::Put(rows) => puts.push(*rows),
            RunnerChange::Quota(delta) => shared.quota(delta),
            RunnerChange::Usage(UsageDelta { tier, node, leases, vcpu, memory_mb }) => {
                let sums = usage.entry((tier, node)).or_default();
                sums[0] += leases;
                sums[1] += vcpu;
                sums[2] += memory_mb;
            }
        }
    }
    (puts, shared, usage)
}
