-- Tenants' workload quotas (issue 14), written by the workload quota projection
-- (workload_quota_views): per tenant and kind of workload (lease, vm, rental, run), each limit
-- operators set as events beside what is held against it.

-- Each quota's working state (postcard), for the next batch.
CREATE TABLE workload_quota_view_states (
    stream_key uuid PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL,
    state      bytea NOT NULL
);

-- One row per tenant and kind: limits is [{resource, used, max}] by resource (max 0: no
-- limit). tenant_id scopes every tenant query.
CREATE TABLE workload_quotas (
    tenant_id  text COLLATE "C" NOT NULL,
    kind       text COLLATE "C" NOT NULL,
    limits     jsonb NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, kind)
);
