-- The run timeline read model (issue 13), written by the run projection (run_views).

-- Each run's working state (postcard), for the next batch.
CREATE TABLE run_view_states (
    run_id    uuid PRIMARY KEY,
    tenant_id text COLLATE "C" NOT NULL,
    state     bytea NOT NULL
);

-- A tenant's runs: attempts (id, node, offer, launch, phase, exit code), booking, outcome,
-- exit code, cleanup, and Leasehold's receipt time of the last look. tenant_id scopes every
-- query. Never here: fencing tokens, operation ids, credentials.
CREATE TABLE run_timeline (
    run_id           uuid PRIMARY KEY,
    tenant_id        text COLLATE "C" NOT NULL,
    rental_id        uuid,
    booking_id       uuid,
    status           text COLLATE "C" NOT NULL,
    node_id          uuid,
    attempts         jsonb NOT NULL,
    cancel_requested boolean NOT NULL,
    outcome          text COLLATE "C",
    exit_code        integer,
    failure          text,
    cleanup          text COLLATE "C",
    last_received_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);

CREATE INDEX run_timeline_by_tenant ON run_timeline (tenant_id, created_at DESC, run_id DESC);
CREATE INDEX run_timeline_by_rental ON run_timeline (rental_id);
