-- A snapshot's reference in its host's store (the agent's id, `snap-...`), written once the
-- agent wrote it: what a VM's seed names, so that placement's locality tie-break finds the
-- hosts holding the seed's bytes (by its digest). Never selected by a tenant query. Rows
-- projected before this column read NULL: no locality hint for them, nothing else changes.
ALTER TABLE snapshot_records ADD COLUMN store_ref text COLLATE "C";
CREATE INDEX snapshot_records_by_store_ref ON snapshot_records (tenant_id, store_ref)
    WHERE store_ref IS NOT NULL AND state = 'ready';
