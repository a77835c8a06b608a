-- Runtime queries of the engine's attempt side: attempt events, the lease reaper, retries, dead letters and
-- their replay, and the overlap gate. $now is NULL in production (the database's clock rules), a fixed
-- instant in tests. Lease instants are always the engine's clock, never a worker's.

-- name: current_instant
-- The one clock: the injected instant if given, else the database's now().
SELECT coalesce($1::timestamptz, now());

-- name: current_database
-- The engine database's name (it names the engine's consumer group on the attempts topic).
SELECT current_database();

-- name: lock_occurrence
-- Locks one occurrence for an attempt decision, with what the decision needs from its schedule and tenant
-- (a tenant without a row gets the retry budget default $2).
SELECT o.occurrence_id, o.schedule_id, o.schedule_version, o.tenant_id, o.target, o.scheduled_for, o.state,
       o.attempt_count, o.attempt_floor, o.lease_token, o.lease_expires_at,
       s.version AS current_version, s.state AS schedule_state, s.retry_max_attempts, s.retry_base_s,
       s.retry_cap_s, s.deadline_s, s.priority, s.payload,
       coalesce(t.retry_budget_per_hour, $2) AS retry_budget_per_hour
FROM occurrences o
JOIN schedules s ON s.schedule_id = o.schedule_id
LEFT JOIN tenants t ON t.tenant_id = o.tenant_id
WHERE o.occurrence_id = $1
FOR UPDATE OF o;

-- name: find_attempt
-- The attempt a lease token belongs to (tokens are unique across all attempts).
SELECT occurrence_id, attempt_number, result, finished_at FROM attempts WHERE lease_token = $1;

-- name: start_attempt
-- Records a started attempt and makes its lease the occurrence's current one (RUNNING, lease until
-- now + $7 seconds on the engine's clock).
WITH attempt AS (
    INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, consumer_group, worker,
                          started_at, lease_expires_at)
    VALUES ($2, $1, $3, $4, $5, $6, coalesce($8::timestamptz, now()),
            coalesce($8::timestamptz, now()) + make_interval(secs => $7))
    RETURNING lease_expires_at
)
UPDATE occurrences
SET state = 'RUNNING', attempt_count = $3, lease_token = $4,
    lease_expires_at = (SELECT lease_expires_at FROM attempt),
    enqueued_at = coalesce(enqueued_at, coalesce($8::timestamptz, now())),
    updated_at = coalesce($8::timestamptz, now())
WHERE occurrence_id = $1
RETURNING lease_expires_at;

-- name: renew_lease
-- A heartbeat of the current attempt: its lease now ends $2 seconds after now.
WITH occurrence AS (
    UPDATE occurrences
    SET lease_expires_at = coalesce($3::timestamptz, now()) + make_interval(secs => $2),
        updated_at = coalesce($3::timestamptz, now())
    WHERE occurrence_id = $4 AND lease_token = $1 AND state = 'RUNNING'
    RETURNING lease_expires_at
)
UPDATE attempts
SET heartbeat_at = coalesce($3::timestamptz, now()), lease_expires_at = (SELECT lease_expires_at FROM occurrence)
WHERE lease_token = $1 AND EXISTS (SELECT 1 FROM occurrence)
RETURNING lease_expires_at;

-- name: finish_attempt
-- Closes an open attempt with its result (succeeded, failed, timed_out, fenced, canceled).
UPDATE attempts
SET finished_at = coalesce($6::timestamptz, now()), result = $2, error_class = $3, error_message = $4,
    permanent = $5
WHERE lease_token = $1 AND finished_at IS NULL
RETURNING attempt_number, started_at;

-- name: finish_occurrence
-- Moves an occurrence to a final state (SUCCEEDED, DEAD, CANCELED) and drops its lease.
UPDATE occurrences
SET state = $2, finished_at = coalesce($6::timestamptz, now()), lease_token = NULL, lease_expires_at = NULL,
    last_error_class = coalesce($3, last_error_class), last_error_message = coalesce($4, last_error_message),
    dead_reason = $5, updated_at = coalesce($6::timestamptz, now())
WHERE occurrence_id = $1;

-- name: wait_for_retry
-- A failed attempt will be retried: RETRY_WAIT until the relay publishes the next delivery.
UPDATE occurrences
SET state = 'RETRY_WAIT', lease_token = NULL, lease_expires_at = NULL, last_error_class = $2,
    last_error_message = $3, updated_at = coalesce($4::timestamptz, now())
WHERE occurrence_id = $1;

-- name: latest_occurrence_message
-- The last occurrence message written for an occurrence (its retries re-send it with a new attempt number).
SELECT message FROM outbox WHERE occurrence_id = $1 AND topic = $2 ORDER BY id DESC LIMIT 1;

-- name: insert_outbox_row
-- Queues one message for the relay in the caller's transaction (a retry, a replay or a dead letter).
-- scheduled_for is the row's own due instant, so the relay's schedule_lag measures its publication delay.
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                    created_at)
VALUES ($1, $2, $3, $4, $5, $6, $6, coalesce($7::timestamptz, now()));

-- name: discard_pending_deliveries
-- An occurrence that finished needs no further delivery: drop its unsent rows on the occurrence topic $2.
UPDATE outbox
SET discarded_at = coalesce($3::timestamptz, now())
WHERE occurrence_id = $1 AND topic = $2 AND sent_at IS NULL AND discarded_at IS NULL;

-- name: spend_retry_budget
-- Spends one retry of tenant $1's budget ($2 per clock hour, UTC); returns a row only if one was left.
-- One conditional upsert: concurrent failures cannot overspend.
INSERT INTO tenant_retry_usage AS u (tenant_id, window_start, retries)
SELECT $1, date_trunc('hour', coalesce($3::timestamptz, now()), 'UTC'), 1
WHERE $2 > 0
ON CONFLICT (tenant_id, window_start) DO UPDATE SET retries = u.retries + 1 WHERE u.retries < $2
RETURNING retries;

-- name: prune_retry_usage
-- Forgets retry-budget windows older than the previous hour.
DELETE FROM tenant_retry_usage
WHERE window_start < date_trunc('hour', coalesce($1::timestamptz, now()), 'UTC') - interval '1 hour';

-- name: expired_leases
-- Locks up to $2 RUNNING occurrences whose lease expired (the worker stopped heartbeating).
-- SKIP LOCKED: several reapers, and the attempt processor, never wait for each other.
SELECT occurrence_id
FROM occurrences
WHERE state = 'RUNNING' AND lease_expires_at <= coalesce($1::timestamptz, now())
ORDER BY lease_expires_at
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: dead_letter_count
-- DEAD occurrences (the dead-letter list's size), all tenants.
SELECT count(*) FROM occurrences WHERE state = 'DEAD';

-- name: list_dead_letters
-- A page of DEAD occurrences, oldest death first, of tenant $1 (NULL: every tenant), after the cursor
-- (finished_at, occurrence_id).
SELECT occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for, attempt_count,
       replay_count, dead_reason, last_error_class, last_error_message, finished_at
FROM occurrences
WHERE state = 'DEAD' AND ($1::text IS NULL OR tenant_id = $1)
  AND ($2::timestamptz IS NULL OR (finished_at, occurrence_id) > ($2, $3::uuid))
ORDER BY finished_at, occurrence_id
LIMIT $4;

-- name: replay_occurrence
-- Re-enqueues a DEAD occurrence: RETRY_WAIT until its new delivery is published, with a fresh count of
-- attempts (attempts before the replay no longer count against max_attempts).
UPDATE occurrences
SET state = 'RETRY_WAIT', attempt_floor = attempt_count, replay_count = replay_count + 1, finished_at = NULL,
    dead_reason = NULL, updated_at = coalesce($2::timestamptz, now())
WHERE occurrence_id = $1 AND state = 'DEAD'
RETURNING *;

-- name: gated_due_schedules
-- Schedules with a held, due outbox row, the longest waiting first.
SELECT oc.schedule_id, min(o.available_at) AS due
FROM outbox o
JOIN occurrences oc ON oc.occurrence_id = o.occurrence_id
WHERE o.claim_expires_at = 'infinity' AND o.claim_token = $2 AND o.sent_at IS NULL AND o.discarded_at IS NULL
  AND o.available_at <= coalesce($1::timestamptz, now())
GROUP BY oc.schedule_id
ORDER BY due
LIMIT $3;

-- name: lock_schedules_in_order
-- Locks schedules in id order (one lock order for every gate: no deadlocks); every overlap decision of a
-- schedule is made under its lock, so two occurrences never both see "nothing running".
SELECT schedule_id, overlap_policy FROM schedules WHERE schedule_id = ANY ($1::uuid[]) ORDER BY schedule_id
FOR UPDATE;

-- name: gated_due_rows
-- The held, due outbox rows of locked schedules $2, oldest occurrence first.
SELECT o.id AS outbox_id, o.occurrence_id, oc.schedule_id, oc.scheduled_for, oc.tenant_id
FROM outbox o
JOIN occurrences oc ON oc.occurrence_id = o.occurrence_id
WHERE oc.schedule_id = ANY ($2::uuid[]) AND o.claim_expires_at = 'infinity' AND o.claim_token = $3
  AND o.sent_at IS NULL AND o.discarded_at IS NULL AND o.available_at <= coalesce($1::timestamptz, now())
ORDER BY oc.schedule_id, oc.scheduled_for, o.id
FOR UPDATE OF o;

-- name: schedules_in_flight
-- Which of schedules $1 have an occurrence in flight: dispatched and not finished. ENQUEUED counts even
-- before a worker reports it started (RUNNING is learned from events, later).
SELECT DISTINCT schedule_id
FROM occurrences
WHERE schedule_id = ANY ($1::uuid[])
  AND (state IN ('ENQUEUED', 'RUNNING', 'RETRY_WAIT') OR (state = 'SCHEDULED' AND dispatched_at IS NOT NULL));

-- name: dispatch_held_rows
-- The gate lets held rows go: the relay may publish them now; their occurrences are in flight from now on.
WITH released AS (
    UPDATE outbox SET claim_token = NULL, claim_expires_at = NULL
    WHERE id = ANY ($1::bigint[]) AND claim_token = $2 AND sent_at IS NULL
    RETURNING occurrence_id
)
UPDATE occurrences
SET dispatched_at = coalesce($3::timestamptz, now()), updated_at = coalesce($3::timestamptz, now())
WHERE occurrence_id IN (SELECT occurrence_id FROM released)
RETURNING occurrence_id;

-- name: skip_held_rows
-- The gate skips held rows: discarded, and their occurrences become SKIPPED_OVERLAP.
WITH discarded AS (
    UPDATE outbox SET discarded_at = coalesce($3::timestamptz, now()), claim_token = NULL, claim_expires_at = NULL
    WHERE id = ANY ($1::bigint[]) AND claim_token = $2 AND sent_at IS NULL
    RETURNING occurrence_id
)
UPDATE occurrences
SET state = 'SKIPPED_OVERLAP', finished_at = coalesce($3::timestamptz, now()),
    updated_at = coalesce($3::timestamptz, now())
WHERE occurrence_id IN (SELECT occurrence_id FROM discarded) AND state = 'SCHEDULED'
RETURNING occurrence_id;
