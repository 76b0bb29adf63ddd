-- Projection checkpoints and the lease read models.
--
-- Each projection's rows and its checkpoint commit in one transaction, so a read model is
-- always exactly the projection of the log up to its checkpoint.

CREATE TABLE projection_checkpoints (
    projection     text COLLATE "C" PRIMARY KEY,
    version        integer NOT NULL,
    -- The cursor of the last event applied: (log_epoch, tx_id, position).
    log_epoch      integer NOT NULL,
    tx_id          xid8 NOT NULL,
    position       bigint NOT NULL,
    events_applied bigint NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- The lease projection's working state: each lease's aggregate state (postcard), from which
-- every lease read model row is derived. Never served.
CREATE TABLE lease_view_states (
    lease_id  uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- The tenant's view of a lease. tenant_id scopes every query and is never returned; there is
-- no last_error, generation or budget here (see lease_diagnostics).
CREATE TABLE leases (
    lease_id       uuid PRIMARY KEY,
    tenant_id      text COLLATE "C" NOT NULL,
    provider_id    uuid NOT NULL,
    status         text COLLATE "C" NOT NULL,
    chain_state    text COLLATE "C" NOT NULL,
    reason         text,
    message        text,
    items          jsonb NOT NULL,
    fail_count     integer NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    retained_until timestamptz,
    restored_from  uuid
);
-- Tenants list their leases newest first, optionally by status.
CREATE INDEX leases_by_tenant ON leases (tenant_id, created_at DESC, lease_id DESC);
CREATE INDEX leases_by_tenant_status ON leases (tenant_id, status, created_at DESC, lease_id DESC);

-- Operator-only diagnostics. Never served to tenants.
CREATE TABLE lease_diagnostics (
    lease_id             uuid PRIMARY KEY,
    tenant_id            text COLLATE "C" NOT NULL,
    backend_name         text,
    last_error           text,
    fail_count           integer NOT NULL,
    generation           bigint NOT NULL,
    budget_verdict       text,
    consecutive_failures integer,
    updated_at           timestamptz NOT NULL
);

-- Each lease's release history.
CREATE TABLE releases (
    lease_id     uuid NOT NULL,
    version      integer NOT NULL,
    tenant_id    text COLLATE "C" NOT NULL,
    payload_hash text NOT NULL,
    status       text COLLATE "C" NOT NULL,
    reason       text,
    message      text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (lease_id, version)
);

-- Released leases whose data is kept for a restore.
CREATE TABLE retained_leases (
    lease_id       uuid PRIMARY KEY,
    tenant_id      text COLLATE "C" NOT NULL,
    provider_id    uuid NOT NULL,
    status         text COLLATE "C" NOT NULL,
    retained_until timestamptz,
    updated_at     timestamptz NOT NULL
);
CREATE INDEX retained_leases_by_tenant ON retained_leases (tenant_id, lease_id);

-- Every workload of every kind, one row each: the unified listing. Leases now; other kinds join.
CREATE TABLE workloads (
    kind         text COLLATE "C" NOT NULL,
    workload_id  uuid NOT NULL,
    tenant_id    text COLLATE "C" NOT NULL,
    status       text COLLATE "C" NOT NULL,
    backend_name text,
    items        jsonb NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (kind, workload_id)
);
CREATE INDEX workloads_by_tenant ON workloads (tenant_id, created_at DESC, workload_id DESC);

-- Per tenant and kind: how many workloads hold resources now. Counters are moved by deltas
-- (INSERT ... ON CONFLICT adds), so they carry no CHECK: PostgreSQL checks the proposed row,
-- a negative delta, before it finds the conflict. The tests assert they never fall below 0.
CREATE TABLE quota_usage (
    tenant_id    text COLLATE "C" NOT NULL,
    kind         text COLLATE "C" NOT NULL,
    active_count bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind)
);

-- Per tenant, kind and SKU: the quantity those workloads hold.
CREATE TABLE quota_usage_skus (
    tenant_id text COLLATE "C" NOT NULL,
    kind      text COLLATE "C" NOT NULL,
    sku       text COLLATE "C" NOT NULL,
    quantity  bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind, sku)
);
