-- Attempts: leases of consumer deliveries, as attempt events and the lease reaper move them.
-- :now is NULL in production (the database's clock rules), a fixed instant in tests. Lease instants are
-- always the engine's clock, never a worker's.

-- name: lock_occurrence
-- Locks one occurrence for an attempt decision, with what the decision needs from its schedule and tenant
-- (a tenant without a row gets the retry budget :default_retry_budget).
SELECT o.occurrence_id, o.schedule_id, o.schedule_version, o.tenant_id, o.target, o.scheduled_for, o.state,
       o.attempt_count, o.attempt_floor, o.lease_token, o.lease_expires_at,
       s.version AS current_version, s.state AS schedule_state, s.retry_max_attempts, s.retry_base_s,
       s.retry_cap_s, s.deadline_s, s.priority, s.payload,
       coalesce(t.retry_budget_per_hour, :default_retry_budget) AS retry_budget_per_hour
FROM occurrences o
JOIN schedules s ON s.schedule_id = o.schedule_id
LEFT JOIN tenants t ON t.tenant_id = o.tenant_id
WHERE o.occurrence_id = :occurrence_id
FOR UPDATE OF o;

-- name: find_attempt
-- The attempt a lease token belongs to (tokens are unique across all attempts).
SELECT * FROM attempts WHERE lease_token = :lease_token;

-- name: start_attempt
-- Records a started attempt and makes its lease the occurrence's current one (RUNNING, lease until
-- now + :lease_ttl_s seconds on the engine's clock).
WITH attempt AS (
    INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, consumer_group, worker,
                          started_at, lease_expires_at)
    VALUES (:attempt_id, :occurrence_id, :attempt_number, :lease_token, :consumer_group, :worker,
            coalesce(:now::timestamptz, now()),
            coalesce(:now::timestamptz, now()) + make_interval(secs => :lease_ttl_s))
    RETURNING lease_expires_at
)
UPDATE occurrences
SET state = 'RUNNING', attempt_count = :attempt_number, lease_token = :lease_token,
    lease_expires_at = (SELECT lease_expires_at FROM attempt),
    enqueued_at = coalesce(enqueued_at, coalesce(:now::timestamptz, now())),
    updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id
RETURNING lease_expires_at;

-- name: renew_lease
-- A heartbeat of the current attempt: its lease now ends :lease_ttl_s seconds after now.
WITH occurrence AS (
    UPDATE occurrences
    SET lease_expires_at = coalesce(:now::timestamptz, now()) + make_interval(secs => :lease_ttl_s),
        updated_at = coalesce(:now::timestamptz, now())
    WHERE occurrence_id = :occurrence_id AND lease_token = :lease_token AND state = 'RUNNING'
    RETURNING lease_expires_at
)
UPDATE attempts
SET heartbeat_at = coalesce(:now::timestamptz, now()),
    lease_expires_at = (SELECT lease_expires_at FROM occurrence)
WHERE lease_token = :lease_token AND EXISTS (SELECT 1 FROM occurrence)
RETURNING lease_expires_at;

-- name: finish_attempt
-- Closes an open attempt with its result (succeeded, failed, timed_out, fenced, canceled).
UPDATE attempts
SET finished_at = coalesce(:now::timestamptz, now()), result = :result, error_class = :error_class,
    error_message = :error_message, permanent = :permanent
WHERE lease_token = :lease_token AND finished_at IS NULL
RETURNING attempt_number, started_at;

-- name: finish_occurrence
-- Moves an occurrence to a final state (SUCCEEDED, DEAD, CANCELED) and drops its lease.
UPDATE occurrences
SET state = :state, finished_at = coalesce(:now::timestamptz, now()), lease_token = NULL, lease_expires_at = NULL,
    last_error_class = coalesce(:error_class, last_error_class),
    last_error_message = coalesce(:error_message, last_error_message),
    dead_reason = :dead_reason, updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id;

-- name: wait_for_retry
-- A failed attempt will be retried: RETRY_WAIT until the relay publishes the next delivery.
UPDATE occurrences
SET state = 'RETRY_WAIT', lease_token = NULL, lease_expires_at = NULL, last_error_class = :error_class,
    last_error_message = :error_message, updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id;

-- name: expired_leases
-- Locks up to :limit RUNNING occurrences whose lease expired (the worker stopped heartbeating).
-- SKIP LOCKED: several reapers, and the attempt processor, never wait for each other.
SELECT occurrence_id
FROM occurrences
WHERE state = 'RUNNING' AND lease_expires_at <= coalesce(:now::timestamptz, now())
ORDER BY lease_expires_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;
