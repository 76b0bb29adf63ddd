-- The runner fleet's read models (issue 14), written by the runner fleet projection
-- (runner_fleet_views): each tenant's runner capacity against its limits, and each runner
-- node's last registration.

-- Each runner capacity's and runner node's working state (postcard), for the next batch.
CREATE TABLE runner_fleet_view_states (
    stream_key uuid PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL,
    state      bytea NOT NULL
);

-- A tenant's runner capacity: the limits operators set (events; 0: no limit) beside what is
-- charged against them now. tenant_id scopes every tenant query.
CREATE TABLE runner_capacities (
    tenant_id       text COLLATE "C" PRIMARY KEY,
    max_vcpu        bigint NOT NULL,
    max_memory_mb   bigint NOT NULL,
    max_macos_slots integer NOT NULL,
    tier_limits     jsonb NOT NULL,
    vcpu            bigint NOT NULL,
    memory_mb       bigint NOT NULL,
    macos           integer NOT NULL,
    tiers           jsonb NOT NULL,
    updated_at      timestamptz
);

-- Each runner node (the fleet's; operators only): its last registration, node epoch and
-- last inventory.
CREATE TABLE runner_nodes (
    node             text COLLATE "C" PRIMARY KEY,
    provider         text COLLATE "C" NOT NULL,
    guest_os         text[] NOT NULL,
    accepts          text[] NOT NULL,
    vcpu             integer NOT NULL,
    memory_mb        bigint NOT NULL,
    node_epoch       bigint NOT NULL,
    retired          boolean NOT NULL,
    registered_at    timestamptz,
    inventory_leases integer,
    inventory_at     timestamptz,
    updated_at       timestamptz
);
