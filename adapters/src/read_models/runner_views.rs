//! What tenants and operators read of runner leases: `runner_leases` (each beside what
//! `runner_lease_holds` keeps of its node, epoch and instance, which the gateway shows
//! operators only), `job_history` and `runner_usage`. Every tenant query filters by the
//! caller's tenant in SQL ([`Scope`]).

use chrono::{DateTime, Utc};
use leasehold_domain::StoreError;
use tokio_postgres::Row;
use uuid::Uuid;

use super::rented::{RentedListing, Scope, page_of};
use super::{PgReadModels, QuotaLimit};

/// A runner lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The columns of `runner_leases` and, for operators, of its hold.
pub struct RunnerLeaseSummary {
    pub lease_id: Uuid,
    pub tenant_id: String,
    pub tier: String,
    pub trust: String,
    pub guest_os: String,
    pub vcpu: i32,
    pub memory_mb: i64,
    pub providers: Vec<String>,
    pub phase: String,
    pub job_request: Option<Uuid>,
    pub job_run: Option<i64>,
    pub outcome: Option<String>,
    pub failure_reason: Option<String>,
    pub teardown: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    pub held_since: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Operators only: its node, epoch and instance.
    pub hold: Option<HoldFacts>,
}

/// What `runner_lease_holds` keeps of a lease (operators' and agents' only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldFacts {
    /// Its bound node.
    pub node: Option<String>,
    /// Its epoch.
    pub epoch: i64,
    /// The provider's handle for its instance.
    pub instance: Option<String>,
}

const LEASE_COLUMNS: &str = "l.lease_id, l.tenant_id, l.tier, l.trust, l.guest_os, l.vcpu, \
     l.memory_mb, l.providers, l.phase, l.job_request, l.job_run, l.outcome, l.failure_reason, \
     l.teardown, l.expires_at, l.held_since, l.created_at, l.updated_at, h.node, h.epoch, \
     h.instance";

const LEASE_FROM: &str =
    "runner_leases l LEFT JOIN runner_lease_holds h ON h.lease_id = l.lease_id";

fn lease_of(row: &Row) -> RunnerLeaseSummary {
    let epoch: Option<i64> = row.get(19);
    RunnerLeaseSummary {
        lease_id: row.get(0),
        tenant_id: row.get(1),
        tier: row.get(2),
        trust: row.get(3),
        guest_os: row.get(4),
        vcpu: row.get(5),
        memory_mb: row.get(6),
        providers: row.get(7),
        phase: row.get(8),
        job_request: row.get(9),
        job_run: row.get(10),
        outcome: row.get(11),
        failure_reason: row.get(12),
        teardown: row.get(13),
        expires_at: row.get(14),
        held_since: row.get(15),
        created_at: row.get(16),
        updated_at: row.get(17),
        hold: epoch.map(|epoch| HoldFacts { node: row.get(18), epoch, instance: row.get(20) }),
    }
}

/// A CI job as its runner leases saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The columns of `job_history`.
pub struct JobSummary {
    pub job_id: Uuid,
    pub tenant_id: String,
    pub request_id: Uuid,
    pub run_id: i64,
    pub lease_id: Uuid,
    pub tier: String,
    pub status: String,
    pub queued_at: DateTime<Utc>,
    pub assigned_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
    pub failure_reason: Option<String>,
}

fn job_of(row: &Row) -> JobSummary {
    JobSummary {
        job_id: row.get(0),
        tenant_id: row.get(1),
        request_id: row.get(2),
        run_id: row.get(3),
        lease_id: row.get(4),
        tier: row.get(5),
        status: row.get(6),
        queued_at: row.get(7),
        assigned_at: row.get(8),
        finished_at: row.get(9),
        outcome: row.get(10),
        failure_reason: row.get(11),
    }
}

/// What one tier charges on one node now (`node` empty before a lease is bound).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The columns of `runner_usage`.
pub struct RunnerUsageRow {
    pub tier: String,
    pub node: String,
    pub leases: i64,
    pub vcpu: i64,
    pub memory_mb: i64,
}

impl PgReadModels {
    /// One runner lease in `scope`.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_lease(
        &self,
        scope: Scope<'_>,
        lease: Uuid,
    ) -> Result<Option<RunnerLeaseSummary>, StoreError> {
        let sql = format!(
            "SELECT {LEASE_COLUMNS} FROM {LEASE_FROM} \
             WHERE l.lease_id = $1 AND ($2::text IS NULL OR l.tenant_id = $2)"
        );
        let rows = self.query(&sql, &[&lease, &scope.param()]).await?;
        Ok(rows.first().map(lease_of))
    }

    /// A page of the runner leases in `scope`, newest first (`state`: a phase).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_leases(
        &self,
        scope: Scope<'_>,
        listing: &RentedListing,
    ) -> Result<Vec<RunnerLeaseSummary>, StoreError> {
        let (limit, after_at, after_id) = page_of(listing);
        let sql = format!(
            "SELECT {LEASE_COLUMNS} FROM {LEASE_FROM} \
             WHERE ($1::text IS NULL OR l.tenant_id = $1) AND ($2::text IS NULL OR l.phase = $2) \
             AND ($3::timestamptz IS NULL OR (l.created_at, l.lease_id) < ($3, $4::uuid)) \
             ORDER BY l.created_at DESC, l.lease_id DESC LIMIT $5"
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&scope.param(), &listing.state, &after_at, &after_id, &limit];
        let rows = self.query(&sql, &params).await?;
        Ok(rows.iter().map(lease_of).collect())
    }

    /// A page of the CI jobs in `scope`, the latest queued first (`state`: a status), each
    /// positioned by `(queued_at, job_id)`.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_jobs(
        &self,
        scope: Scope<'_>,
        listing: &RentedListing,
    ) -> Result<Vec<JobSummary>, StoreError> {
        let (limit, after_at, after_id) = page_of(listing);
        let rows = self
            .query(
                "SELECT job_id, tenant_id, request_id, run_id, lease_id, tier, status, queued_at, \
                 assigned_at, finished_at, outcome, failure_reason FROM job_history \
                 WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR status = $2) \
                 AND ($3::timestamptz IS NULL OR (queued_at, job_id) < ($3, $4::uuid)) \
                 ORDER BY queued_at DESC, job_id DESC LIMIT $5",
                &[&scope.param(), &listing.state, &after_at, &after_id, &limit],
            )
            .await?;
        Ok(rows.iter().map(job_of).collect())
    }

    /// What every tier charges on every node now (rows at zero left out).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_usage(&self) -> Result<Vec<RunnerUsageRow>, StoreError> {
        let rows = self
            .query(
                "SELECT tier, node, leases, vcpu, memory_mb FROM runner_usage \
                 WHERE leases <> 0 OR vcpu <> 0 OR memory_mb <> 0 ORDER BY tier, node",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| RunnerUsageRow {
                tier: row.get(0),
                node: row.get(1),
                leases: row.get(2),
                vcpu: row.get(3),
                memory_mb: row.get(4),
            })
            .collect())
    }

    /// `tenant`'s runner capacity as limits beside their usage (none before its first
    /// assignment or limits): vCPUs, memory, macOS runners and each tier's leases.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runner_limits(
        &self,
        tenant: &leasehold_domain::TenantId,
    ) -> Result<Option<Vec<QuotaLimit>>, StoreError> {
        let rows = self
            .query(
                "SELECT max_vcpu, vcpu, max_memory_mb, memory_mb, max_macos_slots, macos, \
                 tier_limits, tiers FROM runner_capacities WHERE tenant_id = $1",
                &[&tenant.as_str()],
            )
            .await?;
        Ok(rows.first().map(capacity_limits))
    }
}

fn capacity_limits(row: &Row) -> Vec<QuotaLimit> {
    let unsigned = |value: i64| u64::try_from(value).unwrap_or_default();
    let limit = |resource: &str, max: i64, used: i64| QuotaLimit {
        resource: resource.into(),
        used: unsigned(used),
        max: unsigned(max),
    };
    let mut limits = vec![
        limit("runner.vcpu", row.get(0), row.get(1)),
        limit("runner.memory_mb", row.get(2), row.get(3)),
        limit("runner.macos", i64::from(row.get::<_, i32>(4)), i64::from(row.get::<_, i32>(5))),
    ];
    let (tier_limits, tiers): (serde_json::Value, serde_json::Value) = (row.get(6), row.get(7));
    let entries = |value: &serde_json::Value, field: &str| -> Vec<(String, u64)> {
        value
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|entry| {
                let tier = entry["tier"].as_str().unwrap_or_default().to_string();
                (tier, entry[field].as_u64().unwrap_or_default())
            })
            .collect()
    };
    let (maxima, used) = (entries(&tier_limits, "max"), entries(&tiers, "leases"));
    let mut names: Vec<&String> = maxima.iter().chain(&used).map(|(tier, _)| tier).collect();
    names.sort();
    names.dedup();
    for tier in names {
        let find = |list: &[(String, u64)]| {
            list.iter().find(|(name, _)| name == tier).map_or(0, |(_, value)| *value)
        };
        limits.push(QuotaLimit {
            resource: format!("runner.tier.{tier}"),
            used: find(&used),
            max: find(&maxima),
        });
    }
    limits
}
