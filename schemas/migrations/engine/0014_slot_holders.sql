-- chronoq engine, migration 0014 (after the history archive, 0013): a slot runs at most once across schedule
-- versions, and every occurrence a change cancels says which version did it.
--
-- A slot is (schedule_id, scheduled_for): the same scheduled instant of the same schedule, whatever the
-- version (engine/rules/slots.py). An update, pause or cancel cancels the unfinished occurrences of older
-- versions; only those proven never published (SCHEDULED, no outbox row ever claimed or sent, no ahead-lane
-- row before its shard's seal — checked under the rows' locks) give their slot up (slot_released_at), so the
-- new version may materialize the instant again. Every other occurrence keeps its slot, and the unique index
-- below turns the materializer's insert of the same slot under a newer version into a no-op (its insert is
-- ON CONFLICT DO NOTHING): a slot that might have reached a consumer is never materialized a second time
-- under a new occurrence_id.

ALTER TABLE occurrences
    ADD COLUMN canceled_by_version integer,       -- the schedule version whose change canceled it
    ADD COLUMN slot_released_at    timestamptz;   -- gave its slot to a newer version: never published
-- The history archive (0013) keeps exactly the hot table's columns in the same order: its moves are
-- INSERT ... SELECT * and its readers UNION ALL the two tables.
ALTER TABLE archive.occurrences
    ADD COLUMN canceled_by_version integer,
    ADD COLUMN slot_released_at    timestamptz;

-- Before this migration a pause re-materialized slots under the new version: the older occurrence of such a
-- slot gives it up, so each slot has one holder and the index can be built on old data.
UPDATE occurrences o
SET slot_released_at = o.updated_at
WHERE o.origin <> 'manual' AND EXISTS (
    SELECT 1 FROM occurrences n
    WHERE n.schedule_id = o.schedule_id AND n.scheduled_for = o.scheduled_for
      AND n.schedule_version > o.schedule_version AND n.origin <> 'manual'
);

-- Manual occurrences ("trigger now") are extra runs on purpose, at an instant of their own: they hold no slot.
CREATE UNIQUE INDEX occurrences_slot_holder ON occurrences (schedule_id, scheduled_for)
    WHERE slot_released_at IS NULL AND origin <> 'manual';

-- The tenant gate (engine/loops/tenant_gate.py) and the materializer count a tenant's open occurrences
-- (SCHEDULED, ENQUEUED, RUNNING, RETRY_WAIT) against its max_running, and its deliveries held for it.
CREATE INDEX occurrences_tenant_open ON occurrences (tenant_id)
    WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT');
CREATE INDEX outbox_tenant_held ON outbox (tenant_id, available_at)
    WHERE claim_expires_at = 'infinity' AND sent_at IS NULL AND discarded_at IS NULL;
