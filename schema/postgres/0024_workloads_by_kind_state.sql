-- A page of a tenant's workloads filtered by kind and state (issue 14) reads this index in
-- order instead of filtering the tenant's whole newest-first index: a rare kind and state is
-- as quick as a common one.
CREATE INDEX workloads_by_kind_state
    ON workloads (tenant_id, kind, status, created_at DESC, workload_id DESC);
