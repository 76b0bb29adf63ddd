//! Tenants' workload quotas as `quotaUsage` shows them: each kind's limits (set by operators
//! as events) beside what is held against them, from `workload_quotas`.

use leasehold_domain::{StoreError, TenantId};

use super::{PgReadModels, QuotaLimit};

impl PgReadModels {
    /// `tenant`'s workload quotas by kind (`lease`, `vm`, `rental`, `run`): every resource
    /// limited or held, named `<kind>.<resource>`; none for a kind before its first workload
    /// or limits.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn workload_limits(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<(String, Vec<QuotaLimit>)>, StoreError> {
        let rows = self
            .query(
                "SELECT kind, limits FROM workload_quotas WHERE tenant_id = $1 ORDER BY kind",
                &[&tenant.as_str()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let kind: String = row.get(0);
                let limits: serde_json::Value = row.get(1);
                let limits = limits
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|limit| QuotaLimit {
                        resource: format!("{kind}.{}", limit["resource"].as_str().unwrap_or("")),
                        used: limit["used"].as_u64().unwrap_or(0),
                        max: limit["max"].as_u64().unwrap_or(0),
                    })
                    .collect();
                (kind, limits)
            })
            .collect())
    }
}
