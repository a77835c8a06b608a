-- chronoq consumer runtime, migration 0004 (after 0003; renumbered at merge): one effect per slot, not only
-- per occurrence.
--
-- A slot is (schedule_id, scheduled_for): the same scheduled instant of the same schedule, whatever its
-- version. The engine materializes a slot again under a newer version only when the older occurrence was
-- provably never published (engine migration 0014), so two occurrence ids of one slot never both reach a
-- consumer. This index makes the consumer hold the same rule on its own: the runtime's dedupe insert
-- (ON CONFLICT DO NOTHING, no conflict target) then skips a second occurrence of an applied slot exactly
-- like a redelivery of the same occurrence — including deliveries published before the engine had the rule.
--
-- Rows applied before this migration may already hold two occurrences of one slot (the double run this
-- prevents): the later ones are marked superseded and left out of the index, so the migration never fails
-- on old data and nothing is deleted.

ALTER TABLE chronoq_consumer_dedupe
    ADD COLUMN superseded boolean NOT NULL DEFAULT false;

UPDATE chronoq_consumer_dedupe d
SET superseded = true
WHERE EXISTS (
    SELECT 1 FROM chronoq_consumer_dedupe e
    WHERE e.consumer_group = d.consumer_group AND e.schedule_id = d.schedule_id
      AND e.scheduled_for = d.scheduled_for
      AND (e.applied_at, e.occurrence_id) < (d.applied_at, d.occurrence_id)
);

CREATE UNIQUE INDEX chronoq_consumer_dedupe_slot
    ON chronoq_consumer_dedupe (consumer_group, schedule_id, scheduled_for) WHERE NOT superseded;
