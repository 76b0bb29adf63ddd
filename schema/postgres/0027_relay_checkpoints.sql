-- Where each relay of the log to an outside system stands: the cursor of the last event
-- every event up to which the outside system acknowledged, so that a restart resumes there
-- (at least once: events after it may be published again).
CREATE TABLE relay_checkpoints (
    relay          text COLLATE "C" PRIMARY KEY,
    log_epoch      integer NOT NULL,
    tx_id          xid8 NOT NULL,
    position       bigint NOT NULL,
    -- Events acknowledged since the relay first ran.
    published      bigint NOT NULL DEFAULT 0,
    -- Publishing failures (a failure stops the relay; it resumes from its checkpoint).
    publish_errors bigint NOT NULL DEFAULT 0,
    last_error     text,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
