-- The rentals read model (issue 13), written by the rental projection (rental_views).

-- Each rental's working state (postcard), for the next batch.
CREATE TABLE rental_view_states (
    rental_id uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- A tenant's rentals. tenant_id scopes every query. Never here: the ownership token, the
-- bootstrap, the provider's own name for the machine, operation keys, failure detail.
-- state_since and observed_at are the provider's clock as reported; received_at Leasehold's.
CREATE TABLE rentals (
    rental_id               uuid PRIMARY KEY,
    tenant_id               text COLLATE "C" NOT NULL,
    connection_id           text COLLATE "C" NOT NULL,
    offer_id                text COLLATE "C" NOT NULL,
    state                   text COLLATE "C" NOT NULL,
    generation              bigint NOT NULL,
    node_id                 uuid,
    resources               jsonb NOT NULL,
    interruptible_requested boolean NOT NULL,
    interruptible_allocated boolean,
    pricing                 jsonb,
    max_lifetime_seconds    bigint NOT NULL,
    observed_state          text COLLATE "C",
    state_since             timestamptz,
    observed_at             timestamptz,
    received_at             timestamptz,
    running_run             uuid,
    queued_runs             integer NOT NULL,
    created_at              timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL
);

CREATE INDEX rentals_by_tenant ON rentals (tenant_id, created_at DESC, rental_id DESC);
