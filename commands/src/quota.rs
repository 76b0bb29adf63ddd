//! Tenants' quota streams: the snapshot quota, one per tenant, and the workload quotas, one
//! per tenant and kind (`charges.rs`); each id minted from the tenant (so that it fits a
//! stream id whatever the tenant's id), the same in every process. Operators set the
//! workload limits through [`WorkloadQuotas`].

use leasehold_domain::TenantId;
use leasehold_domain::quota::QuotaId;
use leasehold_domain::workload_quota::{
    Limit, WorkloadKind, WorkloadQuota, WorkloadQuotaCommand, WorkloadQuotaError, WorkloadQuotaId,
};

use crate::lease_service::{Caller, minted_id};
use crate::{CommandError, CommandOutcome, CommandPipeline, CommandStore};

/// `tenant`'s snapshot quota.
pub fn quota_of(tenant: &TenantId) -> QuotaId {
    QuotaId(minted_id("tenant-quota", tenant, ""))
}

/// `tenant`'s quota of workloads of `kind`.
pub fn workload_quota_of(tenant: &TenantId, kind: WorkloadKind) -> WorkloadQuotaId {
    WorkloadQuotaId(minted_id("workload-quota", tenant, kind.name()))
}

type Result<T> = std::result::Result<T, CommandError<WorkloadQuotaError>>;

/// Operators' commands on tenants' workload quotas; the charges themselves are the
/// pipeline's own (`charges.rs`).
#[derive(Debug, Clone)]
pub struct WorkloadQuotas<S> {
    pipeline: CommandPipeline<S>,
}

impl<S: CommandStore> WorkloadQuotas<S> {
    /// The quotas over `pipeline`.
    pub fn new(pipeline: CommandPipeline<S>) -> Self {
        Self { pipeline }
    }

    /// An operator sets every limit of `tenant`'s on workloads of `kind` (an event; a
    /// resource left out, or 0, is not limited). What is held stays held.
    ///
    /// # Errors
    /// [`CommandError`]: the pipeline's; `BAD_INPUT` for a resource the kind never holds.
    pub async fn set_limits(
        &self,
        caller: &Caller,
        key: &str,
        (tenant, kind, limits): (&TenantId, WorkloadKind, Vec<Limit>),
    ) -> Result<CommandOutcome> {
        let stream = workload_quota_of(tenant, kind).stream_id();
        let command = WorkloadQuotaCommand::SetLimits { kind, limits };
        let request =
            caller.request::<WorkloadQuota>(tenant.clone(), (stream, key), command, ())?;
        self.pipeline.execute(request).await
    }

    /// `tenant`'s quota of `kind` as stored now (none before its first workload or limits).
    ///
    /// # Errors
    /// A store failure.
    pub async fn quota(
        &self,
        tenant: &TenantId,
        kind: WorkloadKind,
    ) -> Result<Option<WorkloadQuota>> {
        let stream = workload_quota_of(tenant, kind).stream_id();
        let found = self.pipeline.state::<WorkloadQuota>(&stream).await?;
        Ok(found.filter(|(owner, _, _)| owner == tenant).map(|(_, _, quota)| quota))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_quota_per_tenant_and_a_stream_id_whatever_the_tenants_length() {
        let long = TenantId::parse("t".repeat(200)).expect("the longest tenant id");
        assert!(quota_of(&long).stream_id().as_str().starts_with("tenant-quota-"));
        let acme = TenantId::parse("acme").expect("valid");
        assert_eq!(quota_of(&acme), quota_of(&acme));
        assert_ne!(quota_of(&acme), quota_of(&long));
    }

    #[test]
    fn one_workload_quota_per_tenant_and_kind() {
        let acme = TenantId::parse("acme").expect("a tenant");
        let other = TenantId::parse("other").expect("a tenant");
        let lease = workload_quota_of(&acme, WorkloadKind::Lease);
        assert_eq!(lease, workload_quota_of(&acme, WorkloadKind::Lease));
        assert_ne!(lease, workload_quota_of(&acme, WorkloadKind::Vm));
        assert_ne!(lease, workload_quota_of(&other, WorkloadKind::Lease));
        assert!(lease.stream_id().as_str().starts_with("workload-quota-"));
    }
}
