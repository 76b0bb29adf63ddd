-- What Leasehold last saw of each lease backend, for operators (the `backends` query and
-- /metrics): its health probe (`GET /health`, `GET /stats`) and its last inventory sweep
-- (`GET /provisions` and `GET /retentions`, complete or deferred). Not derived from the log:
-- these are observations of the outside world, overwritten by each probe and sweep, and
-- nothing is decided from them (routing asks the backends itself; the inventory reconciler
-- decides from the listing it just read). Errors here are operator detail, never shown to
-- tenants.
CREATE TABLE backend_status (
    backend_name       text COLLATE "C" PRIMARY KEY,
    fenced             boolean NOT NULL DEFAULT false,
    healthy            boolean,
    health_error       text,
    cpu_load           double precision,
    active_containers  bigint,
    disk_withheld      boolean,
    probed_at          timestamptz,
    swept_at           timestamptz,
    sweep_complete     boolean,
    sweep_error        text,
    provisions         integer,
    identity_bearing   boolean,
    missing            integer,
    orphans            jsonb NOT NULL DEFAULT '[]'
);
