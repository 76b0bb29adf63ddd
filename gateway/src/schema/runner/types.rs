//! The runner lease's GraphQL types.

use async_graphql::{ID, InputObject, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{JobSummary, RunnerHold, RunnerLeaseSummary, RunnerUsageRow};
use leasehold_domain::runner::RunnerLeaseId;
use leasehold_domain::runner_capacity::RunnerCapacity;

/// A CI-runner lease. Tenants never see its epoch, node, instance or start command (and no
/// one ever sees its runner registration, which is never recorded).
#[derive(Debug, Clone, SimpleObject)]
pub struct RunnerLease {
    /// Its id.
    pub id: ID,
    /// Its tenant (operators only; null for tenants, who see only their own).
    pub tenant_id: Option<String>,
    /// The tier it runs under.
    pub tier: String,
    /// Whose code its job runs: `untrusted` or `trusted`.
    pub trust: String,
    /// `linux`, `macos` or `windows`.
    pub guest_os: String,
    /// vCPUs charged.
    pub vcpu: i32,
    /// Memory charged, in MiB.
    pub memory_mb: i64,
    /// The provider kinds it may be launched by.
    pub providers: Vec<String>,
    /// `capacity`, `assigned`, `launching`, `online`, `busy`, `custody`, `teardown`,
    /// `quarantine` (it may hold compute nobody answers for: still charged), `done` or
    /// `failed`. Never moves backwards.
    pub phase: String,
    /// Its job's request.
    pub job_request_id: Option<ID>,
    /// Its job's workflow run.
    pub job_run_id: Option<i64>,
    /// `done` or `failed`, once released.
    pub outcome: Option<String>,
    /// Why it failed (`Expired`, ...).
    pub failure_reason: Option<String>,
    /// Its compute's teardown: `requested` (asked to go, still charged) or `stopped`.
    pub teardown: Option<String>,
    /// When it is reaped unless its holder reports.
    pub expires_at: Option<DateTime<Utc>>,
    /// Since when its tenant's capacity is charged for it.
    pub held_since: Option<DateTime<Utc>>,
    /// Operators only: the node it is bound to.
    pub node: Option<String>,
    /// Operators only: its epoch (reaps and its node's re-registrations move it on).
    pub epoch: Option<i64>,
    /// Operators only: the provider's handle for its instance.
    pub instance_id: Option<String>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl RunnerLease {
    /// `summary` as shown to a tenant (`operator`: with its tenant, node, epoch, instance).
    pub(crate) fn of(summary: RunnerLeaseSummary, operator: bool) -> Self {
        let hold = summary.hold.filter(|_| operator);
        Self {
            id: ID(summary.lease_id.to_string()),
            tenant_id: operator.then_some(summary.tenant_id),
            tier: summary.tier,
            trust: summary.trust,
            guest_os: summary.guest_os,
            vcpu: summary.vcpu,
            memory_mb: summary.memory_mb,
            providers: summary.providers,
            phase: summary.phase,
            job_request_id: summary.job_request.map(|id| ID(id.to_string())),
            job_run_id: summary.job_run,
            outcome: summary.outcome,
            failure_reason: summary.failure_reason,
            teardown: summary.teardown,
            expires_at: summary.expires_at,
            held_since: summary.held_since,
            node: hold.as_ref().and_then(|hold| hold.node.clone()),
            epoch: hold.as_ref().map(|hold| hold.epoch),
            instance_id: hold.and_then(|hold| hold.instance),
            created_at: summary.created_at,
            updated_at: summary.updated_at,
        }
    }
}

/// A runner lease bound to the calling node, as its agent needs it to report.
#[derive(Debug, Clone, SimpleObject)]
pub struct NodeRunnerLease {
    /// The lease.
    pub id: ID,
    /// Its instance's name at the provider (`billet-<lease id>`).
    pub instance_name: String,
    /// The epoch to stamp reports with (`FENCED` otherwise).
    pub epoch: i64,
    /// Its phase.
    pub phase: String,
    /// When it is reaped unless reported on.
    pub expires_at: Option<DateTime<Utc>>,
}

impl From<RunnerHold> for NodeRunnerLease {
    fn from(hold: RunnerHold) -> Self {
        Self {
            id: ID(hold.lease.to_string()),
            instance_name: RunnerLeaseId(hold.lease).instance_name(),
            epoch: hold.epoch,
            phase: hold.phase,
            expires_at: hold.expires_at,
        }
    }
}

/// A CI job as its runner lease saw it.
#[derive(Debug, Clone, SimpleObject)]
pub struct RunnerJob {
    /// Its request.
    pub request_id: ID,
    /// Its workflow run.
    pub run_id: i64,
    /// The lease it was assigned to.
    pub lease_id: ID,
    /// The tier.
    pub tier: String,
    /// `assigned` or `finished`.
    pub status: String,
    /// When its lease was requested.
    pub queued_at: DateTime<Utc>,
    /// When it was assigned.
    pub assigned_at: DateTime<Utc>,
    /// When its lease ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// `done` or `failed`.
    pub outcome: Option<String>,
    /// Why it failed.
    pub failure_reason: Option<String>,
}

impl From<JobSummary> for RunnerJob {
    fn from(job: JobSummary) -> Self {
        Self {
            request_id: ID(job.request_id.to_string()),
            run_id: job.run_id,
            lease_id: ID(job.lease_id.to_string()),
            tier: job.tier,
            status: job.status,
            queued_at: job.queued_at,
            assigned_at: job.assigned_at,
            finished_at: job.finished_at,
            outcome: job.outcome,
            failure_reason: job.failure_reason,
        }
    }
}

/// What one tier charges on one node now (operators).
#[derive(Debug, Clone, SimpleObject)]
pub struct RunnerUsage {
    /// The tier.
    pub tier: String,
    /// The node (null: leases not bound to one yet).
    pub node: Option<String>,
    /// Leases charged.
    pub leases: i64,
    /// vCPUs charged.
    pub vcpu: i64,
    /// Memory charged, in MiB.
    pub memory_mb: i64,
}

impl From<RunnerUsageRow> for RunnerUsage {
    fn from(row: RunnerUsageRow) -> Self {
        Self {
            tier: row.tier,
            node: Some(row.node).filter(|node| !node.is_empty()),
            leases: row.leases,
            vcpu: row.vcpu,
            memory_mb: row.memory_mb,
        }
    }
}

/// One tier's leases against its limit.
#[derive(Debug, Clone, SimpleObject)]
pub struct TierUsage {
    /// The tier.
    pub tier: String,
    /// Its leases charged now.
    pub leases: u32,
    /// Most of them at once (0: no limit).
    pub max: u32,
}

/// A tenant's runner capacity: what is charged against what its limits allow (0: no limit).
#[derive(Debug, Clone, SimpleObject)]
pub struct RunnerCapacityView {
    /// vCPUs charged.
    pub vcpu: u64,
    /// Most vCPUs.
    pub max_vcpu: u64,
    /// Memory charged, in MiB.
    pub memory_mb: u64,
    /// Most memory, in MiB.
    pub max_memory_mb: u64,
    /// macOS runners charged.
    pub macos: u32,
    /// Most macOS runners.
    pub max_macos_slots: u32,
    /// Each tier with leases charged or a limit.
    pub tiers: Vec<TierUsage>,
}

impl From<RunnerCapacity> for RunnerCapacityView {
    fn from(capacity: RunnerCapacity) -> Self {
        let (limits, usage) = (capacity.limits, capacity.usage);
        let mut tiers: Vec<TierUsage> = limits
            .tiers
            .iter()
            .map(|limit| TierUsage {
                tier: limit.tier.to_string(),
                leases: usage.tiers.get(&limit.tier).copied().unwrap_or(0),
                max: limit.max,
            })
            .collect();
        for (tier, leases) in &usage.tiers {
            if limits.tiers.iter().all(|limit| &limit.tier != tier) {
                tiers.push(TierUsage { tier: tier.to_string(), leases: *leases, max: 0 });
            }
        }
        tiers.sort_by(|a, b| a.tier.cmp(&b.tier));
        Self {
            vcpu: usage.vcpu,
            max_vcpu: limits.vcpu,
            memory_mb: usage.memory_mb,
            max_memory_mb: limits.memory_mb,
            macos: usage.macos,
            max_macos_slots: limits.macos_slots,
            tiers,
        }
    }
}

/// Which runner leases to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct RunnerLeaseFilter {
    /// Only leases in this phase.
    pub phase: Option<String>,
}

/// `requestRunnerLease`.
#[derive(Debug, Clone, InputObject)]
pub struct RequestRunnerLeaseInput {
    /// Your idempotency key (the lease's id is minted from it).
    pub operation_key: String,
    /// The tier (`linux-4x`).
    pub tier: String,
    /// Whose code its job runs: `untrusted` or `trusted` (nothing else is accepted).
    pub trust: String,
    /// `linux`, `macos` or `windows`.
    pub guest_os: String,
    /// What to charge.
    pub resources: RunnerResourcesInput,
    /// The provider kinds that may launch it: `docker`, `ec2`, `firecracker`, `tart`.
    pub providers: Vec<String>,
    /// The argv that starts the runner in its instance (at least one argument). Not a
    /// credential: the runner's registration is minted at launch and never recorded.
    pub command: Vec<String>,
    /// Seconds it lives without a report of its holder (30 to 3600).
    pub ttl_seconds: u32,
}

/// What a runner lease is charged.
#[derive(Debug, Clone, Copy, InputObject)]
pub struct RunnerResourcesInput {
    /// vCPUs (1 to 256).
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mb: u64,
}

/// `assignRunnerJob`.
#[derive(Debug, Clone, InputObject)]
pub struct AssignRunnerJobInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The job's request (one lease per job: another lease's job is `CONFLICT`).
    pub request_id: ID,
    /// The job's workflow run.
    pub run_id: u64,
}

/// `releaseRunnerLease`.
#[derive(Debug, Clone, InputObject)]
pub struct ReleaseRunnerLeaseInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// `done` or `failed` (the same again is success; another is `CONFLICT`).
    pub outcome: String,
    /// Why it failed (a reason code such as `JobFailed`).
    pub reason: Option<String>,
}

/// `registerRunnerNode`: the node the token names.
#[derive(Debug, Clone, InputObject)]
pub struct RegisterRunnerNodeInput {
    /// Your idempotency key.
    pub operation_key: String,
    /// Its backend: `docker`, `ec2`, `firecracker` or `tart`.
    pub provider: String,
    /// The guest OSes it runs.
    pub guest_os: Vec<String>,
    /// The trust classes its backend accepts.
    pub accepts: Vec<String>,
    /// Its vCPUs.
    pub vcpu: u32,
    /// Its memory, in MiB.
    pub memory_mb: u64,
    /// The leases whose instances it holds now, when it knows: null means it does not know
    /// (nothing is settled), an empty list that it holds none.
    pub inventory: Option<Vec<ID>>,
}

/// `reportRunnerInventory`.
#[derive(Debug, Clone, InputObject)]
pub struct RunnerInventoryInput {
    /// Your idempotency key.
    pub operation_key: String,
    /// The registration the inventory was taken under (an earlier one is `FENCED`).
    pub node_epoch: u64,
    /// The leases whose instances it holds.
    pub leases: Vec<ID>,
}

/// A node agent's report on one of its node's leases.
#[derive(Debug, Clone, InputObject)]
pub struct RunnerReportInput {
    /// The lease (bound to your node).
    pub lease_id: ID,
    /// The epoch you read (`FENCED` when the lease has moved on).
    pub epoch: u64,
    /// Your idempotency key.
    pub operation_key: String,
}

/// `forceRunnerRelease`.
#[derive(Debug, Clone, InputObject)]
pub struct ForceRunnerReleaseInput {
    /// The lease (in custody, teardown or quarantine).
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// Why you are sure its compute is gone (operators only, recorded as your word).
    pub detail: String,
}

/// One tier's limit.
#[derive(Debug, Clone, InputObject)]
pub struct TierLimitInput {
    /// The tier.
    pub tier: String,
    /// Most of its leases at once (0: no limit).
    pub max: u32,
}

/// `setRunnerLimits`.
#[derive(Debug, Clone, InputObject)]
pub struct SetRunnerLimitsInput {
    /// The tenant.
    pub tenant_id: String,
    /// Your idempotency key.
    pub operation_key: String,
    /// Most vCPUs charged at once (0: no limit).
    pub vcpu: u64,
    /// Most memory charged at once, in MiB (0: no limit).
    pub memory_mb: u64,
    /// Per-tier concurrency limits (each tier once).
    pub tiers: Vec<TierLimitInput>,
    /// Most macOS runners at once (0: no limit).
    pub macos_slots: u32,
}
