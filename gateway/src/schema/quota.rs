//! Tenants' workload quotas (leases, VMs, rentals, runs): operators set each kind's limits as
//! events (`setWorkloadLimits`) and read any tenant's usage against them
//! (`tenantQuotaUsage`); a tenant reads its own in `quotaUsage`. The charges themselves are
//! the command pipeline's: every creation is admitted against its kind's limits in its own
//! append (`QUOTA_EXCEEDED` otherwise).

use async_graphql::{Context, InputObject, Object};
use leasehold_commands::workload_quota_of;
use leasehold_domain::Aggregate;
use leasehold_domain::workload_quota::{Limit, WorkloadKind, WorkloadQuota};

use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::reads::KindReads;
use crate::schema::command::{CommandResult, answer_on, caller_of};
use crate::schema::lease::types::QuotaUsageView;
use crate::schema::query::tenant_arg;
use crate::schema::{require, shared};

/// What reads the workload quotas: the quota projection's `workload_quotas`, through the
/// fields over every kind (`quotaUsage`, `tenantQuotaUsage`).
pub(crate) const READS: KindReads = KindReads {
    stream_type: WorkloadQuota::STREAM_TYPE,
    projection: "workload_quota_views",
    projection_fields: &[],
    log_fields: &[],
    joins: &[],
};

/// Operators' queries on tenants' quotas.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuotaQuery;

#[Object]
impl QuotaQuery {
    /// A tenant's usage by kind, against the limits set on it (operators): what `quotaUsage`
    /// shows that tenant.
    async fn tenant_quota_usage(
        &self,
        ctx: &Context<'_>,
        tenant_id: String,
    ) -> ApiResult<Vec<QuotaUsageView>> {
        require(ctx, &[Role::Operator], "read a tenant's quota usage")?;
        let tenant = tenant_arg(&tenant_id)?;
        let usage = shared(ctx).read_models.quota_usage(&tenant).await?;
        Ok(usage.into_iter().map(QuotaUsageView::from).collect())
    }
}

/// Operators' commands on tenants' quotas.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuotaMutation;

/// `setWorkloadLimits`: every limit of one tenant's on one kind of workload.
#[derive(Debug, Clone, InputObject)]
pub struct SetWorkloadLimitsInput {
    /// The tenant.
    pub tenant_id: String,
    /// The kind: `lease`, `vm`, `rental` or `run`.
    pub kind: String,
    /// Your idempotency key.
    pub operation_key: String,
    /// Every limit (a resource left out, or 0, is not limited): `count` for each kind;
    /// `sku.<SKU>` for leases; `cpus`, `gpus`, `ram_mb` for VMs; `cpu_millis`, `memory_mb`,
    /// `disk_gb`, `gpus` for rentals; `max_runtime_seconds` for runs.
    pub limits: Vec<WorkloadLimitInput>,
}

/// One limit.
#[derive(Debug, Clone, InputObject)]
pub struct WorkloadLimitInput {
    /// The resource, within the kind (`count`, `cpus`, `sku.gpu-a100`).
    pub resource: String,
    /// The most the tenant's workloads of the kind may hold together (0: no limit).
    pub max: u64,
}

#[Object]
impl QuotaMutation {
    /// Sets every limit of a tenant's on one kind of workload (operators): an event on its
    /// quota. A lower limit refuses what would grow usage past it; nothing held is touched.
    async fn set_workload_limits(
        &self,
        ctx: &Context<'_>,
        input: SetWorkloadLimitsInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Operator], "set workload limits")?;
        let tenant = tenant_arg(&input.tenant_id)?;
        let kind = WorkloadKind::parse(&input.kind)
            .ok_or_else(|| ApiError::bad_input("kind: one of lease, vm, rental, run"))?;
        let mut limits: Vec<Limit> = Vec::with_capacity(input.limits.len());
        // Checked here too, so that bad input names its field before any key is looked up
        // (the quota's own guard holds the invariant for every caller).
        for (index, limit) in input.limits.into_iter().enumerate() {
            if !kind.holds(&limit.resource) {
                let kind = kind.name();
                let message = format!("limits[{index}].resource: {kind} workloads hold no such");
                return Err(ApiError::bad_input(message));
            }
            if limits.iter().any(|known| known.resource == limit.resource) {
                return Err(ApiError::bad_input(format!("limits[{index}].resource: twice")));
            }
            limits.push(Limit { resource: limit.resource, max: limit.max });
        }
        let caller = caller_of(principal, None);
        let id = workload_quota_of(&tenant, kind).0.to_string();
        let key = input.operation_key.as_str();
        let run = shared(ctx).quotas.set_limits(&caller, key, (&tenant, kind, limits));
        answer_on(ctx, id, run).await
    }
}
