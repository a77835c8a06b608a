-- The control plane's schedule lifecycle and what it reads about schedules: versions, occurrences, attempts.
-- :now is NULL in production (the database's clock rules), a fixed instant in tests.
-- Every query that reads or changes a schedule is scoped by tenant_id: another
-- tenant's schedule is simply not found.

-- name: insert_schedule
-- Creates a schedule; with a created_by_key, a second create with the same key is a no-op (returns nothing).
INSERT INTO schedules (
    schedule_id, tenant_id, kind, expression, time_zone, dst_repeat, dst_gap, anchor, start_at, end_at,
    next_run_at, state, target, payload, priority, flexible_window_s, misfire_policy, max_lateness_s,
    overlap_policy, retry_max_attempts, retry_base_s, retry_cap_s, deadline_s, shard, created_by_key,
    fires_per_minute, request_hash, calendar_id, calendar_name, max_runs, created_at, updated_at)
VALUES (:schedule_id, :tenant_id, :kind, :expression, :time_zone, :dst_repeat, :dst_gap, :anchor, :start_at,
        :end_at, :next_run_at, :state, :target, :payload, :priority, :flexible_window_s, :misfire_policy,
        :max_lateness_s, :overlap_policy, :retry_max_attempts, :retry_base_s, :retry_cap_s, :deadline_s, :shard,
        :created_by_key, :fires_per_minute, :request_hash, :calendar_id, :calendar_name, :max_runs,
        coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()))
ON CONFLICT (tenant_id, created_by_key) DO NOTHING
RETURNING *;

-- name: get_schedule
-- One schedule of one tenant.
SELECT * FROM schedules WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id;

-- name: lock_schedule
-- One schedule of one tenant, locked for a lifecycle change (the materializer skips it meanwhile).
SELECT * FROM schedules WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id FOR UPDATE;

-- name: get_schedule_by_key
-- The schedule a tenant created with an idempotency key.
SELECT * FROM schedules WHERE tenant_id = :tenant_id AND created_by_key = :created_by_key;

-- name: replace_schedule
-- Writes a new version of a locked schedule: definition, state and cursor.
UPDATE schedules
SET version = version + 1, kind = :kind, expression = :expression, time_zone = :time_zone,
    dst_repeat = :dst_repeat, dst_gap = :dst_gap, anchor = :anchor, start_at = :start_at, end_at = :end_at,
    next_run_at = :next_run_at, state = :state, target = :target, payload = :payload, priority = :priority,
    flexible_window_s = :flexible_window_s, misfire_policy = :misfire_policy, max_lateness_s = :max_lateness_s,
    overlap_policy = :overlap_policy, retry_max_attempts = :retry_max_attempts, retry_base_s = :retry_base_s,
    retry_cap_s = :retry_cap_s, deadline_s = :deadline_s, fires_per_minute = :fires_per_minute,
    calendar_id = :calendar_id, calendar_name = :calendar_name, max_runs = :max_runs,
    updated_at = coalesce(:now::timestamptz, now())
WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id
RETURNING *;

-- name: change_schedule_state
-- A new version of a locked schedule that changes only its state and cursor (pause, resume, cancel).
UPDATE schedules
SET version = version + 1, state = :state, next_run_at = :next_run_at, updated_at = coalesce(:now::timestamptz, now())
WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id
RETURNING *;

-- name: cancel_unclaimed_occurrences
-- Invalidates occurrences of versions older than :new_version that no worker has started (SCHEDULED,
-- ENQUEUED, RETRY_WAIT): they become CANCELED, their unsent outbox rows are discarded, and so are their
-- ahead-lane rows the relay's cursor has not passed. An ENQUEUED one already in Kafka is skipped by
-- consumers, which check the schedule's version before the effect.
-- Returns how many were canceled; the earliest instant among those never published: SCHEDULED and not
-- passed by the ahead-lane cursor (a SCHEDULED occurrence the cursor passed is in Kafka; the settle pass
-- has not recorded it yet) — only those may be re-materialized later without risking a second run of the
-- slot; and how many had not started (SCHEDULED or ENQUEUED: no attempt ran), which the run count gives back.
WITH targets AS (
    SELECT occurrence_id, scheduled_for, available_at, state
    FROM occurrences
    WHERE schedule_id = :schedule_id AND schedule_version < :new_version
      AND state IN ('SCHEDULED', 'ENQUEUED', 'RETRY_WAIT')
    FOR UPDATE
), canceled AS (
    UPDATE occurrences o
    SET state = 'CANCELED', updated_at = coalesce(:now::timestamptz, now())
    FROM targets t
    WHERE o.occurrence_id = t.occurrence_id
    RETURNING t.occurrence_id, t.scheduled_for, t.available_at, t.state AS was
), ahead AS (
    SELECT q.shard, q.lane, q.bucket, q.wrr_round, q.occurrence_id,
           (q.bucket, q.wrr_round, q.occurrence_id) <= (c.published_bucket, c.published_round, c.published_id)
               AS published
    FROM canceled k
    JOIN schedules s ON s.schedule_id = :schedule_id
    JOIN dispatch_queue q ON q.shard = s.shard AND q.lane IN ('strict', 'flexible')
                         AND q.bucket = date_trunc('second', k.available_at, 'UTC') AND q.occurrence_id = k.occurrence_id
    JOIN dispatch_cursors c ON c.shard = q.shard AND c.lane = q.lane
    WHERE k.was = 'SCHEDULED'
), discarded_ahead AS (
    UPDATE dispatch_queue q
    SET discarded_at = coalesce(:now::timestamptz, now())
    FROM ahead a
    WHERE NOT a.published AND q.shard = a.shard AND q.lane = a.lane AND q.bucket = a.bucket
      AND q.wrr_round = a.wrr_round AND q.occurrence_id = a.occurrence_id AND q.discarded_at IS NULL
    RETURNING 1
), discarded AS (
    UPDATE outbox
    SET discarded_at = coalesce(:now::timestamptz, now())
    WHERE occurrence_id IN (SELECT occurrence_id FROM canceled) AND sent_at IS NULL AND discarded_at IS NULL
    RETURNING 1
)
SELECT count(*) AS canceled,
       min(scheduled_for) FILTER (
           WHERE was = 'SCHEDULED' AND occurrence_id NOT IN (SELECT occurrence_id FROM ahead WHERE published)
       ) AS earliest_unpublished,
       count(*) FILTER (WHERE was IN ('SCHEDULED', 'ENQUEUED')) AS never_started
FROM canceled;

-- name: give_back_runs
-- Occurrences canceled before any attempt started were not runs: the schedule's run count gives them back.
UPDATE schedules SET runs = greatest(runs - :count, 0) WHERE schedule_id = :schedule_id
RETURNING *;

-- name: insert_schedule_version
-- Records one version of a schedule in its history.
INSERT INTO schedule_versions (schedule_id, version, tenant_id, change, state, definition, next_run_at,
                               changed_at)
VALUES (:schedule_id, :version, :tenant_id, :change, :state, :definition, :next_run_at,
        coalesce(:now::timestamptz, now()));

-- name: list_schedules
-- A page of a tenant's schedules in creation order, after the cursor (created_at, schedule_id).
SELECT *
FROM schedules
WHERE tenant_id = :tenant_id
  AND (:state::text IS NULL OR state = :state)
  AND (:target::text IS NULL OR target = :target)
  AND (:after_at::timestamptz IS NULL OR (created_at, schedule_id) > (:after_at, :after_id::uuid))
ORDER BY created_at, schedule_id
LIMIT :limit;

-- name: list_schedule_occurrences
-- A page of one schedule's occurrences, oldest first, after the cursor (scheduled_for, occurrence_id): the
-- hot table's and the archive's (history retention, migration 0013; an occurrence is in exactly one).
(SELECT *
 FROM occurrences
 WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id
   AND (:after_at::timestamptz IS NULL OR (scheduled_for, occurrence_id) > (:after_at, :after_id::uuid))
 ORDER BY scheduled_for, occurrence_id
 LIMIT :limit)
UNION ALL
(SELECT *
 FROM archive.occurrences
 WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id
   AND (:after_at::timestamptz IS NULL OR (scheduled_for, occurrence_id) > (:after_at, :after_id::uuid))
 ORDER BY scheduled_for, occurrence_id
 LIMIT :limit)
ORDER BY scheduled_for, occurrence_id
LIMIT :limit;

-- name: get_occurrence
-- One occurrence of one tenant, hot or archived.
SELECT * FROM occurrences WHERE occurrence_id = :occurrence_id AND tenant_id = :tenant_id
UNION ALL
SELECT * FROM archive.occurrences WHERE occurrence_id = :occurrence_id AND tenant_id = :tenant_id;

-- name: list_attempts
-- The attempts of one occurrence, in order, hot or archived (they move with their occurrence).
SELECT * FROM attempts WHERE occurrence_id = :occurrence_id
UNION ALL
SELECT * FROM archive.attempts WHERE occurrence_id = :occurrence_id
ORDER BY attempt_number, started_at;

-- name: list_schedule_versions
-- The version history of one schedule.
SELECT * FROM schedule_versions WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id ORDER BY version;
