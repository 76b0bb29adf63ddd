-- Seals: a global digest over the committed order of the log (DESIGN.md, "Tamper evidence").
--
-- Seal k covers the events after seal k-1's last cursor up to and including its own last
-- cursor, in log order (log_epoch, tx_id, position), and only events below the read horizon,
-- so no event can later commit inside a sealed range. Its digest is
-- sha256(digest_{k-1} || the covered events' hashes in log order), digest_0 being 32 zero
-- bytes. `hashes` keeps those hashes in order and `positions` the events' positions, so that
-- `events verify` can name the first event where the log no longer matches its seal
-- (missing, altered, reordered, inserted) instead of only saying that a range changed. One sealer writes at a time (a transaction-level advisory
-- lock); it only reads events, so it never blocks an append.
CREATE TABLE ledger_seals (
    seal_no        bigint PRIMARY KEY CHECK (seal_no >= 1),
    first_epoch    integer NOT NULL,
    first_tx_id    xid8 NOT NULL,
    first_position bigint NOT NULL,
    last_epoch     integer NOT NULL,
    last_tx_id     xid8 NOT NULL,
    last_position  bigint NOT NULL,
    events         bigint NOT NULL CHECK (events >= 1),
    hashes         bytea NOT NULL,
    positions      bigint[] NOT NULL,
    prev_digest    bytea NOT NULL,
    digest         bytea NOT NULL,
    sealed_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ledger_seals_shape CHECK (
        length(hashes) = 32 * events AND cardinality(positions) = events AND length(prev_digest) = 32 AND length(digest) = 32)
);
