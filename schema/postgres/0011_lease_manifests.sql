-- Lease manifests, kept so the dispatcher can hand a backend the manifest a provision or an
-- update names (fred's `payload`): a manifest may hold the tenant's secrets, so it is never in
-- the log, a read model or a log line. Each is stored sealed (XChaCha20-Poly1305 under a key
-- derived from the server's secret, bound to its tenant and hash), content-addressed by the
-- SHA-256 the lease's events record.
CREATE TABLE lease_manifests (
    tenant_id    text COLLATE "C" NOT NULL,
    payload_hash text COLLATE "C" NOT NULL,
    sealed       bytea NOT NULL,
    stored_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payload_hash)
);
