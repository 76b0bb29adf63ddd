-- The fleet's read models (issue 11): `hosts` for operators, `vms` for their tenants, and each
-- projection's working state (the aggregate's own state, postcard-encoded; never served).
-- Placement reads `host_view_states` as its catalog of the fleet: it may lag the log, and the
-- host's own Reserve, decided on its stream, is what decides.

CREATE TABLE host_view_states (
    host_id text COLLATE "C" PRIMARY KEY,
    state   bytea NOT NULL
);

-- Operators only. Never the host's agent token (it never enters an event).
CREATE TABLE hosts (
    host_id    text COLLATE "C" PRIMARY KEY,
    state      text COLLATE "C" NOT NULL,
    backend    text COLLATE "C" NOT NULL,
    region     text COLLATE "C",
    url        text NOT NULL,
    labels     jsonb NOT NULL,
    capacity   jsonb NOT NULL,
    allocated  jsonb NOT NULL,
    headroom   jsonb NOT NULL,
    vm_count   bigint NOT NULL,
    last_seen  timestamptz,
    updated_at timestamptz NOT NULL
);

CREATE TABLE vm_view_states (
    vm_id     uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- A tenant's VMs. tenant_id scopes every query and is never returned. Never a credential,
-- a credentials' reference, an operation id or operator detail.
CREATE TABLE vms (
    vm_id          uuid PRIMARY KEY,
    tenant_id      text COLLATE "C" NOT NULL,
    task_id        text COLLATE "C" NOT NULL,
    state          text COLLATE "C" NOT NULL,
    task_state     text COLLATE "C",
    host_id        text COLLATE "C",
    url            text,
    spec           jsonb NOT NULL,
    reason         text,
    message        text,
    destroy_reason text COLLATE "C",
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL
);

CREATE INDEX vms_by_tenant ON vms (tenant_id, created_at DESC, vm_id DESC);

-- Operators only: what the fleet's reconcilers gave up on or tore down, one row per kind and
-- entity (a stuck task, an idle VM; an orphan destroy that kept failing).
CREATE TABLE dead_letters (
    kind        text COLLATE "C" NOT NULL,
    entity_id   text COLLATE "C" NOT NULL,
    task_id     text COLLATE "C",
    reason      text NOT NULL,
    retry_count integer NOT NULL,
    payload     jsonb NOT NULL,
    first_seen  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,
    PRIMARY KEY (kind, entity_id)
);
