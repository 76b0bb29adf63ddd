-- Which dispatcher instance claimed a pending row for its send in flight (NULL: not claimed,
-- waiting for its time). A row another instance claimed was left by one that no longer holds
-- the dispatcher's lock (killed mid-send, or its session lost). For the actions whose receiver
-- refuses a repeat atomically (a lease's provision, a VM's boot: the same name answered 409),
-- the instance that takes the lock next sends it again at once instead of waiting out the
-- claim's hold, which for a host agent's boot is minutes.
ALTER TABLE dispatch_outbox ADD COLUMN claimed_by uuid;
