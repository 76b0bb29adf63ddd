-- The runner lease read models (issue 14), written by the runner projection (runner_views),
-- and the job history, written by the job projection (runner_job_views).

-- Each lease's working state (postcard), for the next batch.
CREATE TABLE runner_lease_view_states (
    lease_id  uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- A tenant's runner leases. tenant_id scopes every query. Never here: the epoch, the node,
-- the instance, the start command, any runner registration (none is ever recorded).
CREATE TABLE runner_leases (
    lease_id       uuid PRIMARY KEY,
    tenant_id      text COLLATE "C" NOT NULL,
    tier           text COLLATE "C" NOT NULL,
    trust          text COLLATE "C" NOT NULL,
    guest_os       text COLLATE "C" NOT NULL,
    vcpu           integer NOT NULL,
    memory_mb      bigint NOT NULL,
    providers      text[] NOT NULL,
    phase          text COLLATE "C" NOT NULL,
    job_request    uuid,
    job_run        bigint,
    outcome        text COLLATE "C",
    failure_reason text,
    teardown       text COLLATE "C",
    expires_at     timestamptz,
    held_since     timestamptz,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL
);

CREATE INDEX runner_leases_by_tenant ON runner_leases (tenant_id, created_at DESC, lease_id DESC);

-- What the reconcilers and operators need of each lease (never served to tenants): its
-- node, epoch, instance and expiry.
CREATE TABLE runner_lease_holds (
    lease_id   uuid PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL,
    node       text COLLATE "C",
    epoch      bigint NOT NULL,
    instance   text,
    phase      text COLLATE "C" NOT NULL,
    expires_at timestamptz,
    updated_at timestamptz NOT NULL
);

CREATE INDEX runner_lease_holds_by_node ON runner_lease_holds (node, phase) WHERE node IS NOT NULL;
CREATE INDEX runner_lease_holds_by_expiry ON runner_lease_holds (expires_at)
    WHERE phase NOT IN ('done', 'failed', 'quarantine');

-- Per tier and node ('' before a lease is bound): leases, vCPUs and memory charged now.
-- Moved by deltas, as quota_usage is.
CREATE TABLE runner_usage (
    tier      text COLLATE "C" NOT NULL,
    node      text COLLATE "C" NOT NULL,
    leases    bigint NOT NULL,
    vcpu      bigint NOT NULL,
    memory_mb bigint NOT NULL,
    PRIMARY KEY (tier, node)
);

-- Each job's working state (postcard), for the next batch.
CREATE TABLE runner_job_view_states (
    job_id    uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- A tenant's CI jobs as runner leases saw them.
CREATE TABLE job_history (
    job_id         uuid PRIMARY KEY,
    tenant_id      text COLLATE "C" NOT NULL,
    request_id     uuid NOT NULL,
    run_id         bigint NOT NULL,
    lease_id       uuid NOT NULL,
    tier           text COLLATE "C" NOT NULL,
    status         text COLLATE "C" NOT NULL,
    queued_at      timestamptz NOT NULL,
    assigned_at    timestamptz NOT NULL,
    finished_at    timestamptz,
    outcome        text COLLATE "C",
    failure_reason text
);

CREATE INDEX job_history_by_tenant ON job_history (tenant_id, queued_at DESC, job_id DESC);
