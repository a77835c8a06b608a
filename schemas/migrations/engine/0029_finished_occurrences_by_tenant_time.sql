-- chronoq engine, migration 0029: a tenant's occurrences by time indexed once finished (occurrences_tenant_time
-- becomes occurrences_finished_by_tenant).
--
-- No write of an occurrence is HOT (its state is in partial-index predicates), so every index without a
-- predicate takes an entry at the insert and at each state change: SCHEDULED at materialization, ENQUEUED
-- at the settle, RUNNING at `started`, the outcome last. (tenant_id, scheduled_for) served two kinds of
-- reader: the history's prune and its summaries (finished occurrences, by tenant and age), and the readers
-- of a tenant's recent window in every state (the reconciler's copy, the health endpoint). Open occurrences
-- are already indexed by occurrences_open (schedule_id, same four states), so the window readers now take
-- finished rows from this index and open ones from that one (UNION ALL in their statements), and the three
-- writes of an occurrence's open life put no entry here: one index entry fewer per materialized occurrence,
-- and two fewer on the attempt path (docs/benchmarks.md, stop 53).
--
-- The predicate lists the finished states, so that a reader's `state IN (...)` of finished states implies
-- it. Every occurrence is in exactly one of occurrences_open and this index. The archive keeps its full
-- (tenant_id, scheduled_for) index: chronoq_archive_day drops a detached day's indexes that carry a
-- predicate and ATTACH builds the archive's on it (as for occurrences_slot since 0028).
DROP INDEX occurrences_tenant_time;
CREATE INDEX occurrences_finished_by_tenant ON occurrences (tenant_id, scheduled_for)
    WHERE state IN ('SUCCEEDED', 'DEAD', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP');
