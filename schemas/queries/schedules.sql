-- The control plane's schedule lifecycle and what it reads about schedules: versions, occurrences, attempts.
-- :now is NULL in production (the database's clock rules), a fixed instant in tests.
-- Every query that reads or changes a schedule is scoped by tenant_id: another
-- tenant's schedule is simply not found.

-- name: insert_schedule
-- Creates a schedule (in cohort :cohort_id from its fires :cohort_base, or NULL: its own cursor); with a
-- created_by_key, a second create with the same key is a no-op (returns nothing).
INSERT INTO schedules (
    schedule_id, tenant_id, kind, expression, time_zone, dst_repeat, dst_gap, anchor, start_at, end_at,
    next_run_at, state, target, payload, priority, flexible_window_s, misfire_policy, max_lateness_s,
    overlap_policy, retry_max_attempts, retry_base_s, retry_cap_s, deadline_s, shard, created_by_key,
    fires_per_minute, request_hash, calendar_id, calendar_name, max_runs, cohort_id, cohort_base, created_at,
    updated_at)
VALUES (:schedule_id, :tenant_id, :kind, :expression, :time_zone, :dst_repeat, :dst_gap, :anchor, :start_at,
        :end_at, :next_run_at, :state, :target, :payload, :priority, :flexible_window_s, :misfire_policy,
        :max_lateness_s, :overlap_policy, :retry_max_attempts, :retry_base_s, :retry_cap_s, :deadline_s, :shard,
        :created_by_key, :fires_per_minute, :request_hash, :calendar_id, :calendar_name, :max_runs,
        :cohort_id::uuid, :cohort_base::bigint, coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()))
ON CONFLICT (tenant_id, created_by_key) WHERE created_by_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: get_schedule
-- One schedule of one tenant (a cohort member's cursor and runs from its cohort).
SELECT e.* FROM schedules s CROSS JOIN LATERAL chronoq_effective_schedule(s) e
WHERE s.schedule_id = :schedule_id AND s.tenant_id = :tenant_id;

-- name: lock_schedule
-- One schedule of one tenant, locked for a change: a lifecycle change, a backfill, a run now (the materializer
-- skips it meanwhile). The caller has taken it out of any cohort first (cohort_membership.lock_for_change):
-- its row holds its own cursor.
SELECT * FROM schedules WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id FOR UPDATE;

-- name: get_schedule_by_key
-- The schedule a tenant created with an idempotency key (a cohort member's cursor and runs from its cohort).
SELECT e.* FROM schedules s CROSS JOIN LATERAL chronoq_effective_schedule(s) e
WHERE s.tenant_id = :tenant_id AND s.created_by_key = :created_by_key;

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

-- name: lock_unfinished_older_occurrences
-- Locks the unfinished occurrences of versions older than :new_version (SCHEDULED, ENQUEUED, RUNNING,
-- RETRY_WAIT), in id order, for a change of the schedule (whose row the caller has locked).
SELECT occurrence_id, scheduled_for, available_at, state
FROM occurrences
WHERE schedule_id = :schedule_id AND schedule_version < :new_version
  AND state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
ORDER BY occurrence_id
FOR UPDATE;

-- name: lock_deliveries
-- Locks the deliveries of :occurrence_ids (SCHEDULED occurrences of schedule :schedule_id) and says, per
-- occurrence, whether one may have reached the broker:
-- - an outbox row sent, or claimed by a relay at least once (a publish in progress, acknowledged but not yet
--   marked, or failed with an unknown outcome). Under the row lock a relay's claim either committed before
--   (and shows here) or skips the row (SKIP LOCKED) and finds it discarded afterwards;
-- - an ahead-lane row in a bucket before its shard's seal: a relay may have read it (it reads only sealed
--   buckets, and publishes what it read even if it is discarded meanwhile). The seal is read FOR SHARE, so
--   no relay seals further until this change commits: a row at or after the seal is provably unread.
-- An occurrence with no delivery row found is counted as possibly published (nothing proves otherwise).
WITH seals AS (
    SELECT d.lane, d.sealed_until
    FROM schedules s
    JOIN dispatch_seals d ON d.shard = s.shard
    WHERE s.schedule_id = :schedule_id
    ORDER BY d.lane
    FOR SHARE OF d
), targets AS (
    SELECT o.occurrence_id, o.available_at, s.shard
    FROM occurrences o
    JOIN schedules s ON s.schedule_id = o.schedule_id
    WHERE o.occurrence_id = ANY (:occurrence_ids::uuid[])
), late AS (
    SELECT o.occurrence_id, (o.sent_at IS NOT NULL OR o.publish_attempts > 0) AS published
    FROM outbox o
    WHERE o.occurrence_id = ANY (:occurrence_ids::uuid[])
    ORDER BY o.id
    FOR UPDATE OF o
), ahead AS (
    SELECT q.occurrence_id, q.bucket < coalesce(seals.sealed_until, 'infinity'::timestamptz) AS published
    FROM targets t
    JOIN dispatch_queue q ON q.shard = t.shard AND q.lane IN ('strict', 'flexible')
                         AND q.bucket = date_trunc('second', t.available_at, 'UTC')
                         AND q.occurrence_id = t.occurrence_id
    LEFT JOIN seals ON seals.lane = q.lane
    FOR UPDATE OF q
)
SELECT t.occurrence_id,
       coalesce(bool_or(d.published), true) AS possibly_published
FROM targets t
LEFT JOIN (SELECT * FROM late UNION ALL SELECT * FROM ahead) d ON d.occurrence_id = t.occurrence_id
GROUP BY t.occurrence_id;

-- name: cancel_older_occurrences
-- Cancels :occurrence_ids (locked by lock_unfinished_older_occurrences, RUNNING ones left out) in the name
-- of version :new_version; those in :released_ids were never published and give their slot up to newer
-- versions. Their unsent outbox rows are discarded, and so are their ahead-lane rows the relay's cursor has
-- not passed (a relay that read one before the discard publishes it: consumers skip the obsolete version).
-- Returns how many were canceled.
WITH canceled AS (
    UPDATE occurrences
    SET state = 'CANCELED', canceled_by_version = :new_version, finished_at = coalesce(:now::timestamptz, now()),
        slot_released_at = CASE WHEN occurrence_id = ANY (:released_ids::uuid[])
                                THEN coalesce(:now::timestamptz, now()) END,
        lease_token = NULL, lease_expires_at = NULL, updated_at = coalesce(:now::timestamptz, now())
    WHERE occurrence_id = ANY (:occurrence_ids::uuid[]) AND state IN ('SCHEDULED', 'ENQUEUED', 'RETRY_WAIT')
    RETURNING occurrence_id, available_at, schedule_id
), discarded_ahead AS (
    UPDATE dispatch_queue q
    SET discarded_at = coalesce(:now::timestamptz, now())
    FROM canceled k
    JOIN schedules s ON s.schedule_id = k.schedule_id
    JOIN dispatch_cursors c ON c.shard = s.shard AND c.lane IN ('strict', 'flexible')
    WHERE q.shard = s.shard AND q.lane = c.lane AND q.bucket = date_trunc('second', k.available_at, 'UTC')
      AND q.occurrence_id = k.occurrence_id AND q.discarded_at IS NULL
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (c.published_bucket, c.published_round, c.published_id)
    RETURNING 1
), discarded AS (
    UPDATE outbox
    SET discarded_at = coalesce(:now::timestamptz, now())
    WHERE occurrence_id IN (SELECT occurrence_id FROM canceled) AND sent_at IS NULL AND discarded_at IS NULL
    RETURNING 1
)
SELECT count(*) FROM canceled;

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
-- A page of a tenant's schedules in creation order, after the cursor (created_at, schedule_id); a cohort
-- member's cursor and runs from its cohort.
SELECT e.*
FROM schedules s
CROSS JOIN LATERAL chronoq_effective_schedule(s) e
WHERE s.tenant_id = :tenant_id
  AND (:state::text IS NULL OR s.state = :state)
  AND (:target::text IS NULL OR s.target = :target)
  AND (:after_at::timestamptz IS NULL OR (s.created_at, s.schedule_id) > (:after_at, :after_id::uuid))
ORDER BY s.created_at, s.schedule_id
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
