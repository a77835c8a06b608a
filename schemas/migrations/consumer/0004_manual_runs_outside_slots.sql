-- chronoq consumer runtime, migration 0004: a manual run is not its slot's occurrence.
--
-- 0003 made the consumer hold "one effect per slot" (schedule_id, scheduled_for) on its own. A manual
-- trigger ("trigger now") is a run of its own with an id of its own, outside the slot's uniqueness in the
-- engine too; when it falls on a slot's instant (an injected clock, an instant given to the microsecond),
-- the slot index took it for a second occurrence of the slot and skipped it: a requested run silently never
-- ran. The runtime now records whether a delivery is its slot's occurrence (its id is the slot's
-- deterministic id, schemas.identity.occurrence_id) and only those rows hold the slot.
--
-- Rows applied before this migration are all taken as slot rows (default true), as 0003 treated them, and
-- a runtime of the previous release still running beside a new one (a rolling upgrade) inserts slot rows,
-- as before. The index is rebuilt under the migration's lock: on a dedupe table of many millions of rows,
-- consumers of that database wait for the build (seconds) once, at the first start of the new runtime.

ALTER TABLE chronoq_consumer_dedupe
    ADD COLUMN slot boolean NOT NULL DEFAULT true;

DROP INDEX chronoq_consumer_dedupe_slot;

CREATE UNIQUE INDEX chronoq_consumer_dedupe_slot
    ON chronoq_consumer_dedupe (consumer_group, schedule_id, scheduled_for) WHERE slot AND NOT superseded;
