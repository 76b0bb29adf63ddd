-- A VM's credentials: its auth token (minted for it) and its tenant's secrets, sealed with
-- AES-256-GCM under a key kept outside the database (`serve --vm-credentials-key-file`, or the
-- data directory's `vm-credentials-key`). The associated data binds each row to its reference
-- and tenant, so a sealed row moved to another VM does not open. Events and read models carry
-- only the reference. Never served, never logged.
CREATE TABLE vm_credentials (
    reference  uuid PRIMARY KEY,
    tenant_id  text COLLATE "C" NOT NULL,
    nonce      bytea NOT NULL,
    sealed     bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Each host agent's bearer token (fuse's `token` of a host's registration), sealed the same
-- way, bound to the host's id; a registration that names a token replaces it.
CREATE TABLE host_tokens (
    host_id    text COLLATE "C" PRIMARY KEY,
    nonce      bytea NOT NULL,
    sealed     bytea NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
