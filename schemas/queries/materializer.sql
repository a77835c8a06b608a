-- The materializer: due schedules become occurrences and outbox rows, and their cursors advance.
-- Every time-sensitive query takes :now: NULL in production (the database's clock rules), a fixed
-- instant in tests.

-- name: claim_due_schedules
-- Locks up to :limit active schedules whose cursor falls within the horizon (:horizon_s seconds ahead of
-- now), of the given :shards (NULL: all). SKIP LOCKED lets several materializers share the table;
-- uniqueness of occurrences stays the final guard.
SELECT schedule_id, tenant_id, kind, expression, time_zone, dst_repeat, dst_gap, anchor, start_at, end_at,
       version, next_run_at, target, payload, priority, flexible_window_s, misfire_policy, max_lateness_s,
       deadline_s, overlap_policy, calendar_id, max_runs, runs
FROM schedules
WHERE state = 'active'
  AND next_run_at <= coalesce(:now::timestamptz, now()) + make_interval(secs => :horizon_s)
  AND (:shards::int[] IS NULL OR shard = ANY (:shards::int[]))
ORDER BY next_run_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: insert_occurrences
-- Inserts occurrences (SCHEDULED or MISSED) and, for each SCHEDULED one actually inserted, its outbox row.
-- An occurrence that already exists (overlapping materializers, replays) is left alone and gets no second
-- outbox row. Rows flagged in :held (schedules with an overlap policy) are written already held by the
-- overlap gate: claimed with :gate_token, a claim that never expires, so no relay publishes them before
-- the gate decided. Returns how many occurrences and outbox rows were written, and per schedule how many
-- SCHEDULED occurrences were inserted (its new runs).
WITH input AS (
    SELECT *
    FROM unnest(:occurrence_ids::uuid[], :schedule_ids::uuid[], :schedule_versions::int[], :tenant_ids::text[],
                :targets::text[], :scheduled_fors::timestamptz[], :available_ats::timestamptz[], :states::text[],
                :topics::text[], :message_keys::bytea[], :messages::bytea[], :held::bool[])
         AS t(occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
              available_at, state, topic, message_key, message, held)
), inserted AS (
    INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,
                             scheduled_for, available_at, state, created_at, updated_at)
    SELECT occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for, available_at,
           state, coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now())
    FROM input
    ON CONFLICT DO NOTHING
    RETURNING occurrence_id, schedule_id, state
), runs AS (
    SELECT schedule_id, count(*)::int AS runs FROM inserted WHERE state = 'SCHEDULED' GROUP BY schedule_id
), outboxed AS (
    INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                        claim_token, claim_expires_at, created_at)
    SELECT i.occurrence_id, i.tenant_id, i.topic, i.message_key, i.message, i.scheduled_for,
           i.available_at, CASE WHEN i.held THEN :gate_token::uuid END,
           CASE WHEN i.held THEN 'infinity'::timestamptz END, coalesce(:now::timestamptz, now())
    FROM input i JOIN inserted USING (occurrence_id)
    WHERE inserted.state = 'SCHEDULED'
    RETURNING 1
)
SELECT (SELECT count(*) FROM inserted) AS occurrences, (SELECT count(*) FROM outboxed) AS outbox_rows,
       r.schedule_ids AS run_schedule_ids, r.runs AS run_counts
FROM (SELECT array_agg(schedule_id ORDER BY schedule_id) AS schedule_ids, array_agg(runs ORDER BY schedule_id) AS runs
      FROM runs) r;

-- name: advance_schedules
-- Moves each schedule's cursor and adds its new runs, only if its version is still the one the materializer
-- read. A NULL cursor means the schedule has no further fires (or no run left): it becomes completed.
UPDATE schedules s
SET next_run_at = u.next_run_at,
    runs = s.runs + u.runs,
    state = CASE WHEN u.next_run_at IS NULL THEN 'completed' ELSE s.state END,
    updated_at = coalesce(:now::timestamptz, now())
FROM unnest(:schedule_ids::uuid[], :versions::int[], :next_run_ats::timestamptz[], :runs::int[])
     AS u(schedule_id, version, next_run_at, runs)
WHERE s.schedule_id = u.schedule_id AND s.version = u.version AND s.state = 'active';

-- name: due_backlog
-- Active schedules whose cursor is already in the past (work the materializer has not caught up with).
SELECT count(*) FROM schedules WHERE state = 'active' AND next_run_at <= coalesce(:now::timestamptz, now());
