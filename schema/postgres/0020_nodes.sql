-- The nodes read model (issue 13), written by the node projection (node_views).

-- Each node's working state (postcard), for the next batch.
CREATE TABLE node_view_states (
    node_id   uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- The nodes of a tenant's rentals. tenant_id scopes every query. Never here: an enrollment
-- token's hash, a fencing token, operation ids. facts.observed_at is the node's clock;
-- facts_received_at Leasehold's (the facts' age is from it).
CREATE TABLE nodes (
    node_id            uuid PRIMARY KEY,
    tenant_id          text COLLATE "C" NOT NULL,
    rental_id          uuid NOT NULL,
    generation         bigint NOT NULL,
    state              text COLLATE "C" NOT NULL,
    agent_version      text,
    facts              jsonb,
    facts_received_at  timestamptz,
    enrolled_at        timestamptz,
    last_heartbeat_at  timestamptz,
    lease_expires      timestamptz,
    pending_operations integer NOT NULL,
    updated_at         timestamptz NOT NULL
);

CREATE INDEX nodes_by_rental ON nodes (tenant_id, rental_id, generation DESC);
