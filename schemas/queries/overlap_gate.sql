-- The overlap gate: held deliveries of skip_if_running / queue_one schedules are dispatched, kept or skipped.
-- Held rows are outbox rows claimed with the gate's token :gate_token until 'infinity'.

-- name: gated_due_schedules
-- Schedules with a held, due outbox row whose decision can move something, the longest waiting first. A
-- queue_one schedule with an occurrence in flight and one row waiting is left out: deciding it again changes
-- nothing until that occurrence finishes, and however many such schedules wait they never hide the rows of
-- the others (nor keep the gate busy when nothing can move). Work per pass: the held due rows, and one
-- index probe per schedule holding them.
WITH held AS (
    SELECT oc.schedule_id, min(o.available_at) AS due, count(*) AS waiting
    FROM outbox o
    JOIN occurrences oc ON oc.occurrence_id = o.occurrence_id
    WHERE o.claim_expires_at = 'infinity' AND o.claim_token = :gate_token AND o.sent_at IS NULL
      AND o.discarded_at IS NULL AND o.available_at <= coalesce(:now::timestamptz, now())
    GROUP BY oc.schedule_id
)
SELECT h.schedule_id, h.due
FROM held h
JOIN schedules s ON s.schedule_id = h.schedule_id
WHERE NOT (
    s.overlap_policy = 'queue_one' AND h.waiting = 1
    AND EXISTS (
        SELECT 1 FROM occurrences f
        WHERE f.schedule_id = h.schedule_id
          AND (f.state IN ('ENQUEUED', 'RUNNING', 'RETRY_WAIT') OR (f.state = 'SCHEDULED' AND f.dispatched_at IS NOT NULL))
    )
)
ORDER BY h.due
LIMIT :limit;

-- name: lock_schedules_in_order
-- Locks schedules in id order (one lock order for every gate: no deadlocks); every overlap decision of a
-- schedule is made under its lock, so two occurrences never both see "nothing running".
SELECT schedule_id, overlap_policy FROM schedules WHERE schedule_id = ANY (:schedule_ids::uuid[])
ORDER BY schedule_id
FOR UPDATE;

-- name: gated_due_rows
-- The held, due outbox rows of the locked schedules, oldest occurrence first.
SELECT o.id AS outbox_id, o.occurrence_id, oc.schedule_id, oc.scheduled_for, oc.tenant_id
FROM outbox o
JOIN occurrences oc ON oc.occurrence_id = o.occurrence_id
WHERE oc.schedule_id = ANY (:schedule_ids::uuid[]) AND o.claim_expires_at = 'infinity'
  AND o.claim_token = :gate_token AND o.sent_at IS NULL AND o.discarded_at IS NULL
  AND o.available_at <= coalesce(:now::timestamptz, now())
ORDER BY oc.schedule_id, oc.scheduled_for, o.id
FOR UPDATE OF o;

-- name: schedules_in_flight
-- Which of the schedules have an occurrence in flight: dispatched and not finished. ENQUEUED counts even
-- before a worker reports it started (RUNNING is learned from events, later).
SELECT DISTINCT schedule_id
FROM occurrences
WHERE schedule_id = ANY (:schedule_ids::uuid[])
  AND (state IN ('ENQUEUED', 'RUNNING', 'RETRY_WAIT') OR (state = 'SCHEDULED' AND dispatched_at IS NOT NULL));

-- name: dispatch_held_rows
-- The gate lets held rows go: the relay may publish them now; their occurrences are in flight from now on.
WITH released AS (
    UPDATE outbox SET claim_token = NULL, claim_expires_at = NULL
    WHERE id = ANY (:outbox_ids::bigint[]) AND claim_token = :gate_token AND sent_at IS NULL
    RETURNING occurrence_id
)
UPDATE occurrences
SET dispatched_at = coalesce(:now::timestamptz, now()), updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id IN (SELECT occurrence_id FROM released)
RETURNING occurrence_id;

-- name: skip_held_rows
-- The gate skips held rows: discarded, and their occurrences become SKIPPED_OVERLAP.
WITH discarded AS (
    UPDATE outbox SET discarded_at = coalesce(:now::timestamptz, now()), claim_token = NULL, claim_expires_at = NULL
    WHERE id = ANY (:outbox_ids::bigint[]) AND claim_token = :gate_token AND sent_at IS NULL
    RETURNING occurrence_id
)
UPDATE occurrences
SET state = 'SKIPPED_OVERLAP', finished_at = coalesce(:now::timestamptz, now()),
    updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id IN (SELECT occurrence_id FROM discarded) AND state = 'SCHEDULED'
RETURNING occurrence_id;
