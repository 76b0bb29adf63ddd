-- The event log: streams, events, the log epoch, aggregate snapshots.
-- Names use the "C" collation so that ordering never depends on the server's locale.

CREATE TABLE log_meta (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Raised after a logical restore, where transaction ids start again from lower values.
    current_epoch integer NOT NULL DEFAULT 1 CHECK (current_epoch >= 1)
);
INSERT INTO log_meta DEFAULT VALUES;

CREATE TABLE streams (
    stream_id   text COLLATE "C" PRIMARY KEY,
    stream_type text COLLATE "C" NOT NULL,
    tenant_id   text COLLATE "C" NOT NULL,
    -- The number of events in the stream; the last event's version.
    version     bigint NOT NULL,
    -- The last event's hash: the next event chains from it.
    last_hash   bytea NOT NULL,
    -- The transaction that last appended. A later append must run in a later transaction,
    -- so that per-stream order in the whole-log order equals version order.
    last_tx_id  xid8 NOT NULL,
    -- One CHECK per table: each constraint's expression is rebuilt for every statement that
    -- writes the table, and the append path writes these tables on every call.
    CONSTRAINT streams_shape CHECK (version >= 1 AND length(last_hash) = 32)
);

CREATE TABLE events (
    position       bigint GENERATED ALWAYS AS IDENTITY,
    log_epoch      integer NOT NULL DEFAULT 1,
    tx_id          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event_id       uuid NOT NULL UNIQUE,
    stream_id      text COLLATE "C" NOT NULL,
    version        bigint NOT NULL,
    stream_type    text COLLATE "C" NOT NULL,
    tenant_id      text COLLATE "C" NOT NULL,
    event_type     text COLLATE "C" NOT NULL,
    schema_version integer NOT NULL,
    payload        jsonb NOT NULL,
    metadata       jsonb NOT NULL,
    recorded_at    timestamptz NOT NULL,
    prev_hash      bytea NOT NULL,
    hash           bytea NOT NULL,
    CONSTRAINT events_shape CHECK (
        version >= 1 AND schema_version >= 0 AND length(prev_hash) = 32 AND length(hash) = 32),
    -- The whole-log order every reader uses. Identity values are unique on their own; the
    -- key is this triple so that one index serves both uniqueness and the log order.
    PRIMARY KEY (log_epoch, tx_id, position),
    UNIQUE (stream_id, version)
);

-- Aggregate snapshots: postcard-encoded state at a stream version. A snapshot whose
-- state_schema differs from the reader's is ignored, never decoded.
CREATE TABLE snapshots (
    stream_id    text COLLATE "C" PRIMARY KEY,
    version      bigint NOT NULL CHECK (version >= 1),
    state_schema integer NOT NULL,
    state        bytea NOT NULL,
    taken_at     timestamptz NOT NULL DEFAULT now()
);
