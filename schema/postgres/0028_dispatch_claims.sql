-- Which dispatcher instance claimed a pending row for its send in flight (NULL: not claimed,
-- waiting for its time). Only the instance holding the dispatcher's lock sends, so a row
-- claimed by any other instance was claimed by one that is gone (killed mid-send, or its
-- session lost): the instance that takes the lock next sends it again at once instead of
-- waiting out the claim's hold, which for a host agent's boot is minutes.
ALTER TABLE dispatch_outbox ADD COLUMN claimed_by uuid;
