//! Tenants' quota streams: one per tenant, its id minted from the tenant (so that it fits a
//! stream id whatever the tenant's id), the same in every process.

use leasehold_domain::TenantId;
use leasehold_domain::quota::QuotaId;

use crate::lease_service::minted_id;

/// `tenant`'s snapshot quota.
pub fn quota_of(tenant: &TenantId) -> QuotaId {
    QuotaId(minted_id("tenant-quota", tenant, ""))
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
}
