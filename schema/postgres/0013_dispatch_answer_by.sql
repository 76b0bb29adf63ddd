-- Work a backend took (`202`) and must settle by callback has a deadline: `answer_by`. Past
-- it, with the work still awaited, the dispatcher records the lapse as the work's failure
-- (fred's control plane gives a callback 10 minutes) and the row becomes `lapsed`. Work
-- settled otherwise (no callback expected: a release) has none.
ALTER TABLE dispatch_outbox ADD COLUMN answer_by timestamptz;
ALTER TABLE dispatch_outbox DROP CONSTRAINT dispatch_outbox_state_check;
ALTER TABLE dispatch_outbox ADD CONSTRAINT dispatch_outbox_state_check
    CHECK (state IN ('pending', 'delivered', 'refused', 'superseded', 'lapsed'));
CREATE INDEX dispatch_outbox_awaiting ON dispatch_outbox (dispatcher, answer_by)
    WHERE state = 'delivered' AND answer_by IS NOT NULL;
