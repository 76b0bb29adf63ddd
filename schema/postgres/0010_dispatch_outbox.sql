-- The dispatcher's outbox (issue 10): backend work that an event on the log started and that
-- its backend has not yet taken. The event is the record of intent; this table is only the
-- dispatcher's index of what is still to send, kept by the dispatcher as it reads the log
-- (an intake is idempotent, so a replay after a crash changes nothing) and rebuildable from
-- the log. Each attempt's answer is an event on the work's stream.
CREATE TABLE dispatch_outbox (
    -- The stream whose event started the work, and the work's generation on it.
    stream_id        text        NOT NULL,
    generation       bigint      NOT NULL,
    -- The event that started it (its id), and its tenant.
    event_id         uuid        NOT NULL,
    tenant_id        text        NOT NULL,
    -- The reconciler that sends it (one per kind of work).
    dispatcher       text        NOT NULL,
    -- Who is called (a backend's name) and what is asked of it.
    target           text        NOT NULL,
    action           text        NOT NULL,
    -- What the kind needs to make the call: never a secret (callback URLs and request bodies
    -- without credentials).
    request          jsonb       NOT NULL,
    -- pending: to send; delivered: taken; refused: refused for good; superseded: newer work
    -- on the same stream started before this was taken.
    state            text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'refused', 'superseded')),
    -- Attempts claimed so far (claimed before each send, so a number is never reused).
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    -- Operator-only: why the last attempt failed.
    last_error       text,
    recorded_at      timestamptz NOT NULL,
    settled_at       timestamptz,
    PRIMARY KEY (stream_id, generation)
);

CREATE INDEX dispatch_outbox_due ON dispatch_outbox (dispatcher, next_attempt_at)
    WHERE state = 'pending';
