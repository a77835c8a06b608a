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

-- name: lock_occurrences
-- Locks the occurrences :occurrence_ids a batch of attempt events names, in id order (one lock order for
-- every batch: no deadlocks between them), with what the event rules read: the occurrence's state and lease,
-- and whether its schedule moved on (current version, state); available_at and enqueued_at tell the processor
-- how late an attempt started (engine/rules/consumers_behind.py). The schedule is read per row (LATERAL ...
-- OFFSET 0 keeps it an index probe, never a scan of every schedule). A failure's retry decision reads the
-- rest with lock_occurrence.
SELECT o.occurrence_id, o.schedule_id, o.schedule_version, o.tenant_id, o.target, o.state, o.attempt_count,
       o.lease_token, o.lease_expires_at, o.enqueued_at, o.finished_at, o.last_error_class, o.last_error_message,
       o.dead_reason, s.version AS current_version, s.state AS schedule_state, o.scheduled_for, o.available_at
FROM occurrences o
CROSS JOIN LATERAL (SELECT version, state FROM schedules WHERE schedule_id = o.schedule_id OFFSET 0) s
WHERE o.occurrence_id = ANY (:occurrence_ids::uuid[])
ORDER BY o.occurrence_id
FOR UPDATE OF o;

-- name: lock_occurrences_of_days
-- lock_occurrences for events that name their occurrence's scheduled_for (attempt event field, migration
-- 0016): :days, the distinct instants, prune the lookup to those days' partitions instead of probing every
-- day's key. An id whose instant was wrong is simply not found here; the caller looks it up by id alone.
SELECT o.occurrence_id, o.schedule_id, o.schedule_version, o.tenant_id, o.target, o.state, o.attempt_count,
       o.lease_token, o.lease_expires_at, o.enqueued_at, o.finished_at, o.last_error_class, o.last_error_message,
       o.dead_reason, s.version AS current_version, s.state AS schedule_state, o.scheduled_for, o.available_at
FROM occurrences o
CROSS JOIN LATERAL (SELECT version, state FROM schedules WHERE schedule_id = o.schedule_id OFFSET 0) s
WHERE o.occurrence_id = ANY (:occurrence_ids::uuid[]) AND o.scheduled_for = ANY (:days::timestamptz[])
ORDER BY o.occurrence_id
FOR UPDATE OF o;

-- name: attempts_by_token
-- The attempts the lease tokens :lease_tokens name (tokens are unique across all attempts), of occurrences
-- scheduled at :days (an attempt lives in its occurrence's day partition).
SELECT lease_token, occurrence_id, attempt_number, result, finished_at, claim_order
FROM attempts WHERE lease_token = ANY (:lease_tokens::uuid[]) AND scheduled_for = ANY (:days::timestamptz[]);

-- name: insert_attempts
-- Records the attempts a batch of events opened (closed too, when their outcome came in the same batch):
-- :attempts is a JSON array with one object per attempt, keyed by column. Lease instants are the engine's clock.
-- An attempt lives in its occurrence's day partition (migration 0016): its scheduled_for is the occurrence's,
-- as the processor's lock of the occurrence read it in this transaction (a join to the occurrence here would
-- read it again, a probe per attempt).
INSERT INTO attempts (attempt_id, occurrence_id, attempt_number, lease_token, consumer_group, worker, started_at,
                      heartbeat_at, lease_expires_at, finished_at, result, error_class, error_message, permanent,
                      claim_order, scheduled_for)
SELECT a.attempt_id, a.occurrence_id, a.attempt_number, a.lease_token, a.consumer_group, a.worker, a.started_at,
       a.heartbeat_at, a.lease_expires_at, a.finished_at, a.result, a.error_class, a.error_message, a.permanent,
       a.claim_order, a.scheduled_for
FROM jsonb_to_recordset(:attempts::text::jsonb)
     AS a (attempt_id uuid, occurrence_id uuid, attempt_number integer, lease_token uuid, consumer_group text,
           worker text, started_at timestamptz, heartbeat_at timestamptz, lease_expires_at timestamptz,
           finished_at timestamptz, result text, error_class text, error_message text, permanent boolean,
           claim_order bigint, scheduled_for timestamptz);

-- name: update_attempts
-- Heartbeats and outcomes of attempts recorded before the batch (:attempts, a JSON array of objects keyed by
-- column); a null leaves the column as it was. The attempts' occurrences are locked, so no one else changes them.
UPDATE attempts a
SET heartbeat_at = coalesce(u.heartbeat_at, a.heartbeat_at),
    lease_expires_at = coalesce(u.lease_expires_at, a.lease_expires_at),
    finished_at = coalesce(u.finished_at, a.finished_at), result = coalesce(u.result, a.result),
    error_class = coalesce(u.error_class, a.error_class), error_message = coalesce(u.error_message, a.error_message),
    permanent = coalesce(u.permanent, a.permanent)
FROM jsonb_to_recordset(:attempts::text::jsonb)
     AS u (lease_token uuid, heartbeat_at timestamptz, lease_expires_at timestamptz, finished_at timestamptz,
           result text, error_class text, error_message text, permanent boolean)
WHERE a.lease_token = u.lease_token AND a.lease_token = ANY (:lease_tokens::uuid[])
  AND a.scheduled_for = ANY (:days::timestamptz[]);

-- name: update_occurrences
-- Writes the occurrences a batch of events moved, each column as decided (:occurrences, a JSON array of
-- objects keyed by column). The ANY conditions on :occurrence_ids and :days (their instants) let the planner
-- probe the primary key of those days' partitions instead of scanning the table.
UPDATE occurrences o
SET state = u.state, attempt_count = u.attempt_count, lease_token = u.lease_token,
    lease_expires_at = u.lease_expires_at, enqueued_at = u.enqueued_at, finished_at = u.finished_at,
    last_error_class = u.last_error_class, last_error_message = u.last_error_message, dead_reason = u.dead_reason,
    updated_at = coalesce(:now::timestamptz, now())
FROM jsonb_to_recordset(:occurrences::text::jsonb)
     AS u (occurrence_id uuid, state text, attempt_count integer, lease_token uuid, lease_expires_at timestamptz,
           enqueued_at timestamptz, finished_at timestamptz, last_error_class text, last_error_message text,
           dead_reason text)
WHERE o.occurrence_id = u.occurrence_id AND o.occurrence_id = ANY (:occurrence_ids::uuid[])
  AND o.scheduled_for = ANY (:days::timestamptz[]);

-- name: finish_attempt
-- Closes an open attempt with its result (succeeded, failed, timed_out, fenced, canceled). :scheduled_for is
-- its occurrence's (an attempt lives in its occurrence's day partition): one partition's key is probed, not
-- every day's (30 days of history: 30-odd probes).
UPDATE attempts
SET finished_at = coalesce(:now::timestamptz, now()), result = :result, error_class = :error_class,
    error_message = :error_message, permanent = :permanent
WHERE lease_token = :lease_token AND scheduled_for = :scheduled_for AND finished_at IS NULL
RETURNING attempt_number, started_at;

-- name: finish_occurrence
-- Moves an occurrence to a final state (SUCCEEDED, DEAD, CANCELED) and drops its lease. The caller holds
-- the row locked (lock_occurrence), so its :scheduled_for is exact and prunes the update to its partition.
UPDATE occurrences
SET state = :state, finished_at = coalesce(:now::timestamptz, now()), lease_token = NULL, lease_expires_at = NULL,
    last_error_class = coalesce(:error_class, last_error_class),
    last_error_message = coalesce(:error_message, last_error_message),
    dead_reason = :dead_reason, updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id AND scheduled_for = :scheduled_for;

-- name: wait_for_retry
-- A failed attempt will be retried: RETRY_WAIT until the relay publishes the next delivery. The row is
-- locked by the caller, so its :scheduled_for is exact (one partition, as finish_occurrence).
UPDATE occurrences
SET state = 'RETRY_WAIT', lease_token = NULL, lease_expires_at = NULL, last_error_class = :error_class,
    last_error_message = :error_message, updated_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id AND scheduled_for = :scheduled_for;

-- name: expired_leases
-- Locks up to :limit RUNNING occurrences whose lease expired (the worker stopped heartbeating) before the
-- attempt processor's progress: a heartbeat still unread in chronoq.attempts cannot have been missed. With
-- no progress recorded (no processor ran), now decides alone. SKIP LOCKED: several reapers, and the attempt
-- processor, never wait for each other.
SELECT occurrence_id
FROM occurrences
WHERE state = 'RUNNING'
  AND lease_expires_at <= least(coalesce(:now::timestamptz, now()),
                                (SELECT min(applied_through) FROM attempt_event_progress))
ORDER BY lease_expires_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: reaping_horizon
-- Now, and the instant the reaper judges leases by: now, or the attempt processor's progress if that trails.
SELECT coalesce(:now::timestamptz, now()) AS now,
       least(coalesce(:now::timestamptz, now()), (SELECT min(applied_through) FROM attempt_event_progress)) AS horizon;

-- name: record_attempt_progress
-- The attempt processor read partitions :partitions to their end as of :applied_through (the engine's clock):
-- every event of theirs produced before it is applied. Progress only moves forward. Returns the database's
-- instant (the next round's mark).
WITH progress AS (
    INSERT INTO attempt_event_progress AS p (partition, applied_through, updated_at)
    SELECT partition, :applied_through::timestamptz, coalesce(:now::timestamptz, now())
    FROM unnest(:partitions::integer[]) AS partition
    ON CONFLICT (partition) DO UPDATE
    SET applied_through = greatest(p.applied_through, excluded.applied_through), updated_at = excluded.updated_at
)
SELECT coalesce(:now::timestamptz, now());

-- name: claim_attempt_owners
-- Targets :targets without an owning group are claimed by :consumer_groups (pairwise: the group of the first
-- `started` of the batch for that target). An owner already registered is kept. A concurrent claim of the
-- same target waits for the other transaction and then keeps its row: every engine node sees one owner.
INSERT INTO target_attempt_owners (target, consumer_group, registered_by, registered_at)
SELECT t.target, t.consumer_group, 'first_start', coalesce(:now::timestamptz, now())
FROM unnest(:targets::text[], :consumer_groups::text[]) AS t(target, consumer_group)
ON CONFLICT (target) DO NOTHING;

-- name: attempt_owners
-- The owning consumer group of each of :targets that has one.
SELECT target, consumer_group FROM target_attempt_owners WHERE target = ANY (:targets::text[]);

-- name: register_attempt_owner
-- An operator makes :consumer_group the group whose attempt events count for :target (replacing any owner).
INSERT INTO target_attempt_owners (target, consumer_group, registered_by, registered_at)
VALUES (:target, :consumer_group, 'operator', coalesce(:now::timestamptz, now()))
ON CONFLICT (target) DO UPDATE
SET consumer_group = excluded.consumer_group, registered_by = 'operator', registered_at = excluded.registered_at
RETURNING target, consumer_group, registered_by, registered_at;

-- name: occurrence_leases
-- The state and current lease token of the occurrences :occurrence_ids, read in the attempt processor's
-- transaction after a batch was applied (rows locked by it): what the answers to the batch's `started` say.
-- By id alone this probes the key of every day partition (30 days of history: 30-odd probes per id); the
-- processor asks occurrence_leases_of_days first and this only for ids not found there.
SELECT occurrence_id, state, lease_token FROM occurrences WHERE occurrence_id = ANY (:occurrence_ids::uuid[]);

-- name: occurrence_leases_of_days
-- occurrence_leases for answers whose `started` named its occurrence's scheduled_for: :days, the distinct
-- instants, prune the read to those days' partitions.
SELECT occurrence_id, state, lease_token FROM occurrences
WHERE occurrence_id = ANY (:occurrence_ids::uuid[]) AND scheduled_for = ANY (:days::timestamptz[]);

-- name: announce_consumers_behind
-- An attempt processor applied many starts and outcomes of attempts that started seconds after their
-- occurrences became available: consumers are working through a backlog, and the settle pass waits
-- (chronoq_consumers_behind, migration 0031) until :until_s seconds from now. Raised, never lowered: another
-- processor's later instant stands.
INSERT INTO consumers_behind AS c (singleton, behind_until, announced_at)
VALUES (true, coalesce(:now::timestamptz, now()) + make_interval(secs => :until_s), coalesce(:now::timestamptz, now()))
ON CONFLICT (singleton) DO UPDATE
SET behind_until = greatest(c.behind_until, excluded.behind_until), announced_at = excluded.announced_at;
