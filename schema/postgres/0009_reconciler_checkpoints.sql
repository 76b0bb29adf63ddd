-- Reconcilers keep their checkpoints beside the projections': one table, one namespace of
-- names (a name is one lock), each row saying which of the two it belongs to, so that
-- `projections status` and the GraphQL `projections` query show both with their lag.
ALTER TABLE projection_checkpoints
    ADD COLUMN kind text NOT NULL DEFAULT 'projection'
        CHECK (kind IN ('projection', 'reconciler'));
