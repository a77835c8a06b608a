-- What the console and the timeline read. A :tenant_id that is NULL means an operator: every tenant.

-- name: scoped_schedule
-- One schedule of one tenant (any tenant's when :tenant_id is NULL: an operator); a cohort member's cursor
-- and runs from its cohort.
SELECT e.* FROM schedules s CROSS JOIN LATERAL chronoq_effective_schedule(s) e
WHERE s.schedule_id = :schedule_id AND (:tenant_id::text IS NULL OR s.tenant_id = :tenant_id);

-- name: schedule_versions_of
-- The version history of one schedule (its tenant was checked by the caller).
SELECT * FROM schedule_versions WHERE schedule_id = :schedule_id ORDER BY version;

-- name: timeline_occurrences
-- The occurrences of one schedule in a window (at most :limit), with whether the overlap gate holds them.
SELECT o.occurrence_id, o.schedule_version, o.scheduled_for, o.available_at, o.state, o.attempt_count,
       o.origin, o.requested_by, o.dead_reason, o.last_error_class, o.last_error_message, o.enqueued_at,
       o.finished_at, o.created_at, o.updated_at,
       (o.state = 'SCHEDULED' AND EXISTS (
           SELECT 1 FROM outbox b
           WHERE b.occurrence_id = o.occurrence_id AND b.claim_expires_at = 'infinity'
             AND b.sent_at IS NULL AND b.discarded_at IS NULL)) AS held
FROM occurrences o
WHERE o.schedule_id = :schedule_id AND o.scheduled_for BETWEEN :window_from AND :window_to
ORDER BY o.scheduled_for, o.created_at
LIMIT :limit;

-- name: tenant_catch_up_quota
-- The tenant's catch-up quota (slots per minute a backfill may release).
SELECT catch_up_per_minute FROM tenants WHERE tenant_id = :tenant_id;

-- name: console_schedules
-- A page of schedules, newest first, after the cursor (created_at, schedule_id), of :tenant_id, filtered by
-- :state and :target and searched by :pattern (a LIKE pattern, wildcards escaped) in target, expression,
-- tenant and id. A cohort member's cursor and runs from its cohort.
SELECT e.*
FROM schedules s
CROSS JOIN LATERAL chronoq_effective_schedule(s) e
WHERE (:tenant_id::text IS NULL OR s.tenant_id = :tenant_id)
  AND (:state::text IS NULL OR s.state = :state)
  AND (:target::text IS NULL OR s.target = :target)
  AND (:pattern::text IS NULL OR s.target ILIKE :pattern OR s.expression ILIKE :pattern
       OR s.tenant_id ILIKE :pattern OR s.schedule_id::text ILIKE :pattern)
  AND (:after_at::timestamptz IS NULL OR (s.created_at, s.schedule_id) < (:after_at, :after_id::uuid))
ORDER BY s.created_at DESC, s.schedule_id DESC
LIMIT :limit;

-- name: console_state_counts
-- How many schedules of :tenant_id are in each state.
SELECT state, count(*) AS schedules FROM schedules WHERE (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
GROUP BY state;

-- name: console_occurrences
-- A page of one schedule's occurrences, newest first, after the cursor (scheduled_for, occurrence_id).
SELECT *
FROM occurrences
WHERE schedule_id = :schedule_id
  AND (:after_at::timestamptz IS NULL OR (scheduled_for, occurrence_id) < (:after_at, :after_id::uuid))
ORDER BY scheduled_for DESC, occurrence_id DESC
LIMIT :limit;

-- name: scoped_occurrence
-- One occurrence of :tenant_id (any tenant's when NULL).
SELECT * FROM occurrences WHERE occurrence_id = :occurrence_id AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id);
