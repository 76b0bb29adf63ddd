-- What a tenant sees of a VM's forks and migrations: the VM it is a copy of (and how: `fork`
-- or `migration`), and the copy it is migrating to while its migration is in flight.
ALTER TABLE vms
    ADD COLUMN copied_from  uuid,
    ADD COLUMN copy_kind    text COLLATE "C",
    ADD COLUMN migrating_to uuid;
