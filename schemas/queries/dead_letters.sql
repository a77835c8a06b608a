-- The dead-letter list: DEAD occurrences, listed per tenant and replayed by id.

-- name: dead_letter_count
-- DEAD occurrences (the dead-letter list's size), all tenants.
SELECT count(*) FROM occurrences WHERE state = 'DEAD';

-- name: list_dead_letters
-- A page of DEAD occurrences, oldest death first, of tenant :tenant_id (NULL: every tenant), after the
-- cursor (finished_at, occurrence_id).
SELECT occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for, attempt_count,
       replay_count, dead_reason, last_error_class, last_error_message, finished_at
FROM occurrences
WHERE state = 'DEAD' AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
  AND (:after_at::timestamptz IS NULL OR (finished_at, occurrence_id) > (:after_at, :after_id::uuid))
ORDER BY finished_at, occurrence_id
LIMIT :limit;

-- name: replay_occurrence
-- Re-enqueues a DEAD occurrence: RETRY_WAIT until its new delivery is published, with a fresh count of
-- attempts (attempts before the replay no longer count against max_attempts).
UPDATE occurrences
SET state = 'RETRY_WAIT', attempt_floor = attempt_count, replay_count = replay_count + 1, finished_at = NULL,
    dead_reason = NULL, updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id AND state = 'DEAD'
RETURNING *;
