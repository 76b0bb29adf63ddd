-- Every read-model table belongs to one projection, so that a projection can be rebuilt into
-- tables of its own while the current ones keep serving, and switched over in one transaction
-- (issue 15). The tables several projections wrote become partitioned tables whose
-- partitions each belong to one projection: readers still read the parent, each projection
-- writes only its own partitions. A partition's CHECK restates its bound, so that a rebuilt
-- copy (which carries the CHECK) attaches without a scan.

-- workloads: one partition per kind, each written by that kind's projection.
ALTER TABLE workloads RENAME TO workloads_0025;
ALTER INDEX workloads_pkey RENAME TO workloads_0025_pkey;
ALTER INDEX workloads_by_tenant RENAME TO workloads_0025_by_tenant;
ALTER INDEX workloads_by_kind_state RENAME TO workloads_0025_by_kind_state;
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
) PARTITION BY LIST (kind);
CREATE INDEX workloads_by_tenant ON workloads (tenant_id, created_at DESC, workload_id DESC);
CREATE INDEX workloads_by_kind_state
    ON workloads (tenant_id, kind, status, created_at DESC, workload_id DESC);
CREATE TABLE workloads_lease PARTITION OF workloads
    (CONSTRAINT workloads_lease_kind CHECK (kind = 'lease')) FOR VALUES IN ('lease');
CREATE TABLE workloads_vm PARTITION OF workloads
    (CONSTRAINT workloads_vm_kind CHECK (kind = 'vm')) FOR VALUES IN ('vm');
CREATE TABLE workloads_rental PARTITION OF workloads
    (CONSTRAINT workloads_rental_kind CHECK (kind = 'rental')) FOR VALUES IN ('rental');
CREATE TABLE workloads_run PARTITION OF workloads
    (CONSTRAINT workloads_run_kind CHECK (kind = 'run')) FOR VALUES IN ('run');
CREATE TABLE workloads_runner PARTITION OF workloads
    (CONSTRAINT workloads_runner_kind CHECK (kind = 'runner')) FOR VALUES IN ('runner');
INSERT INTO workloads SELECT * FROM workloads_0025;
DROP TABLE workloads_0025;

-- quota_usage and quota_usage_skus: one partition per kind likewise.
ALTER TABLE quota_usage RENAME TO quota_usage_0025;
ALTER INDEX quota_usage_pkey RENAME TO quota_usage_0025_pkey;
CREATE TABLE quota_usage (
    tenant_id    text COLLATE "C" NOT NULL,
    kind         text COLLATE "C" NOT NULL,
    active_count bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind)
) PARTITION BY LIST (kind);
CREATE TABLE quota_usage_lease PARTITION OF quota_usage
    (CONSTRAINT quota_usage_lease_kind CHECK (kind = 'lease')) FOR VALUES IN ('lease');
CREATE TABLE quota_usage_vm PARTITION OF quota_usage
    (CONSTRAINT quota_usage_vm_kind CHECK (kind = 'vm')) FOR VALUES IN ('vm');
CREATE TABLE quota_usage_rental PARTITION OF quota_usage
    (CONSTRAINT quota_usage_rental_kind CHECK (kind = 'rental')) FOR VALUES IN ('rental');
CREATE TABLE quota_usage_run PARTITION OF quota_usage
    (CONSTRAINT quota_usage_run_kind CHECK (kind = 'run')) FOR VALUES IN ('run');
CREATE TABLE quota_usage_runner PARTITION OF quota_usage
    (CONSTRAINT quota_usage_runner_kind CHECK (kind = 'runner')) FOR VALUES IN ('runner');
INSERT INTO quota_usage SELECT * FROM quota_usage_0025;
DROP TABLE quota_usage_0025;

ALTER TABLE quota_usage_skus RENAME TO quota_usage_skus_0025;
ALTER INDEX quota_usage_skus_pkey RENAME TO quota_usage_skus_0025_pkey;
CREATE TABLE quota_usage_skus (
    tenant_id text COLLATE "C" NOT NULL,
    kind      text COLLATE "C" NOT NULL,
    sku       text COLLATE "C" NOT NULL,
    quantity  bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind, sku)
) PARTITION BY LIST (kind);
CREATE TABLE quota_usage_skus_lease PARTITION OF quota_usage_skus
    (CONSTRAINT quota_usage_skus_lease_kind CHECK (kind = 'lease')) FOR VALUES IN ('lease');
CREATE TABLE quota_usage_skus_vm PARTITION OF quota_usage_skus
    (CONSTRAINT quota_usage_skus_vm_kind CHECK (kind = 'vm')) FOR VALUES IN ('vm');
CREATE TABLE quota_usage_skus_rental PARTITION OF quota_usage_skus
    (CONSTRAINT quota_usage_skus_rental_kind CHECK (kind = 'rental')) FOR VALUES IN ('rental');
CREATE TABLE quota_usage_skus_run PARTITION OF quota_usage_skus
    (CONSTRAINT quota_usage_skus_run_kind CHECK (kind = 'run')) FOR VALUES IN ('run');
CREATE TABLE quota_usage_skus_runner PARTITION OF quota_usage_skus
    (CONSTRAINT quota_usage_skus_runner_kind CHECK (kind = 'runner')) FOR VALUES IN ('runner');
INSERT INTO quota_usage_skus SELECT * FROM quota_usage_skus_0025;
DROP TABLE quota_usage_skus_0025;

-- dead_letters: the projection that wrote a row is its `source`; one partition per source.
ALTER TABLE dead_letters RENAME TO dead_letters_0025;
ALTER INDEX dead_letters_pkey RENAME TO dead_letters_0025_pkey;
CREATE TABLE dead_letters (
    source      text COLLATE "C" NOT NULL,
    kind        text COLLATE "C" NOT NULL,
    entity_id   text COLLATE "C" NOT NULL,
    task_id     text COLLATE "C",
    reason      text NOT NULL,
    retry_count integer NOT NULL,
    payload     jsonb NOT NULL,
    first_seen  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,
    PRIMARY KEY (source, kind, entity_id)
) PARTITION BY LIST (source);
CREATE TABLE dead_letters_vm PARTITION OF dead_letters
    (CONSTRAINT dead_letters_vm_source CHECK (source = 'vm')) FOR VALUES IN ('vm');
CREATE TABLE dead_letters_host PARTITION OF dead_letters
    (CONSTRAINT dead_letters_host_source CHECK (source = 'host')) FOR VALUES IN ('host');
CREATE TABLE dead_letters_snapshot PARTITION OF dead_letters
    (CONSTRAINT dead_letters_snapshot_source CHECK (source = 'snapshot'))
    FOR VALUES IN ('snapshot');
CREATE TABLE dead_letters_runner_fleet PARTITION OF dead_letters
    (CONSTRAINT dead_letters_runner_fleet_source CHECK (source = 'runner_fleet'))
    FOR VALUES IN ('runner_fleet');
-- Rows written before this migration: their source from their kind (a snapshot GC's
-- deletion, an orphan on a host or a runner node, else a VM's task or idleness).
INSERT INTO dead_letters
SELECT CASE
           WHEN kind = 'snapshot_gc' THEN 'snapshot'
           WHEN kind = 'orphan_destroy' AND entity_id LIKE 'runner-node-%' THEN 'runner_fleet'
           WHEN kind = 'orphan_destroy' THEN 'host'
           ELSE 'vm'
       END,
       kind, entity_id, task_id, reason, retry_count, payload, first_seen, last_seen
FROM dead_letters_0025;
DROP TABLE dead_letters_0025;

-- Each projection's rebuilds: a build writes into a schema of its own
-- (`lh_<projection>_<build_no>`) with its own checkpoint, and is switched in by one
-- transaction that swaps its tables with the active ones (the active build's tables move into
-- that build's schema, kept for rollback) and moves `projection_checkpoints` to it.
CREATE TABLE projection_builds (
    projection    text COLLATE "C" NOT NULL,
    -- 0 is the tables the projection had before its first rebuild.
    build_no      integer NOT NULL CHECK (build_no >= 0),
    -- The projection's code version the build was made by.
    version       integer NOT NULL,
    -- building, active, retired (kept for rollback), failed.
    state         text COLLATE "C" NOT NULL,
    log_epoch     integer,
    tx_id         xid8,
    position      bigint,
    events_applied bigint NOT NULL DEFAULT 0,
    -- Events in the log when the build began (for its progress).
    events_total  bigint NOT NULL DEFAULT 0,
    error         text,
    error_position bigint,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    switched_at   timestamptz,
    PRIMARY KEY (projection, build_no)
);

-- The build a projection's checkpoint belongs to: a runner of an earlier build is fenced by
-- it (its next commit finds the build moved and stops).
ALTER TABLE projection_checkpoints ADD COLUMN build_no integer NOT NULL DEFAULT 0;

-- The last failure of each projection's runner (the event it cannot apply, a write refused):
-- it is failing while this is newer than its checkpoint's last commit. Written by the runner
-- that failed, in whichever process, so that `projections status` shows it from any.
CREATE TABLE projection_failures (
    projection text COLLATE "C" PRIMARY KEY,
    error      text NOT NULL,
    position   bigint,
    failed_at  timestamptz NOT NULL DEFAULT now()
);
