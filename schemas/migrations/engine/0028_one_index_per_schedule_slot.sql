-- chronoq engine, migration 0028: one index for a schedule's occurrences and for its slot rule.
--
-- occurrences_schedule (schedule_id, scheduled_for) served every read of a schedule's occurrences (its
-- listing, a change's discard, the reconciler, requested occurrences); occurrences_slot_holder, the same key
-- with the predicate slot_released_at IS NULL AND origin <> 'manual', made a second holder of one slot
-- impossible (migration 0014). Two B-trees of the same key, and no update of an occurrence is HOT (state is
-- in partial-index predicates), so each wrote an entry at the insert and at every state change after it
-- (settle, started, succeeded): two of the five to six entries each write of an occurrence makes.
--
-- One index does both. Its third key part is true for a slot holder and NULL for every other row, and a
-- unique index treats NULLs as distinct: two holders of (schedule_id, scheduled_for) conflict, exactly as
-- under the partial index; a released or manual row never conflicts; and (schedule_id, scheduled_for) is
-- its leading prefix, so every read that used occurrences_schedule uses it unchanged. The materializer's
-- INSERT ... ON CONFLICT DO NOTHING takes every unique index as its arbiter, this one included.
-- Measured in docs/benchmarks.md (stop 49).
--
-- An expression, not a generated column: the history's moves are INSERT ... SELECT * between the hot table
-- and the archive (0013), which a generated column would refuse. The archive move (chronoq_archive_day)
-- drops this index from a day partition it detaches (no archive index has its key) and ATTACH builds the
-- archive's occurrences_schedule on it (~0.3 µs per archived occurrence, once per day: stop 49).
CREATE UNIQUE INDEX occurrences_slot ON occurrences (
    schedule_id, scheduled_for, (CASE WHEN slot_released_at IS NULL AND origin <> 'manual' THEN true END)
);
DROP INDEX occurrences_slot_holder;
DROP INDEX occurrences_schedule;
