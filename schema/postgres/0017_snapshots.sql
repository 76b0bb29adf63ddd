-- The snapshot read models (issue 12), written by the snapshot projection (snapshot_views).

-- Each snapshot or tenant quota stream's working state (postcard), for the next batch.
CREATE TABLE snapshot_view_states (
    stream_id text COLLATE "C" PRIMARY KEY,
    state     bytea NOT NULL
);

-- A tenant's snapshots (`snapshot_records`: `snapshots` holds the aggregates' stored states,
-- 0001). tenant_id scopes every query and is never returned; last_error is the
-- operators' (redacted before it was recorded) and no tenant query selects it. The artifact
-- index is derived from the ready rows here: (tenant, digest) -> host_id, and (tenant,
-- layer_key, arch) -> the newest ready layer.
CREATE TABLE snapshot_records (
    snapshot_id        uuid PRIMARY KEY,
    tenant_id          text COLLATE "C" NOT NULL,
    vm_id              uuid NOT NULL,
    task_id            text COLLATE "C" NOT NULL,
    host_id            text COLLATE "C" NOT NULL,
    state              text COLLATE "C" NOT NULL,
    mode               text COLLATE "C" NOT NULL,
    requested          text COLLATE "C" NOT NULL,
    kind               text COLLATE "C",
    parent_snapshot_id uuid,
    layer_key          text COLLATE "C",
    arch               text COLLATE "C" NOT NULL,
    digest             text COLLATE "C",
    name               text,
    size_bytes         bigint NOT NULL,
    retention_until    timestamptz,
    exports            jsonb NOT NULL,
    last_error         text,
    created_at         timestamptz NOT NULL,
    last_used          timestamptz,
    updated_at         timestamptz NOT NULL
);

-- Newest first, per tenant (the listing's order: created_at desc, then id desc).
CREATE INDEX snapshot_records_by_tenant
    ON snapshot_records (tenant_id, created_at DESC, snapshot_id DESC);
CREATE INDEX snapshot_records_by_vm ON snapshot_records (tenant_id, vm_id);
CREATE INDEX snapshot_records_by_parent ON snapshot_records (tenant_id, parent_snapshot_id)
    WHERE parent_snapshot_id IS NOT NULL;
CREATE INDEX snapshot_records_by_layer
    ON snapshot_records (tenant_id, layer_key, arch, created_at DESC)
    WHERE layer_key IS NOT NULL AND state = 'ready';
CREATE INDEX snapshot_records_by_digest ON snapshot_records (tenant_id, digest)
    WHERE digest IS NOT NULL AND state = 'ready';

-- Each tenant's counted snapshots and bytes against its limits (0: no limit).
CREATE TABLE snapshot_quota_usage (
    tenant_id  text COLLATE "C" PRIMARY KEY,
    count      bigint NOT NULL,
    bytes      bigint NOT NULL,
    max_count  bigint NOT NULL,
    max_bytes  bigint NOT NULL,
    updated_at timestamptz
);
