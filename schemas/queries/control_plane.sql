-- Runtime queries of the control plane: tenants, the schedule lifecycle, reads.
-- $now is NULL in production (the database's clock rules), a fixed instant in tests.
-- Every query that reads or changes a schedule is scoped by tenant_id: another
-- tenant's schedule is simply not found.

-- name: insert_tenant
-- Creates a tenant with its quotas; returns nothing when the name is taken.
INSERT INTO tenants (tenant_id, api_token_hash, signing_key, max_active_schedules, max_fires_per_minute,
                     max_payload_bytes, max_running, catch_up_per_minute, retry_budget_per_hour, weight)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (tenant_id) DO NOTHING
RETURNING *;

-- name: get_tenant
-- One tenant by id.
SELECT * FROM tenants WHERE tenant_id = $1;

-- name: tenant_by_token_hash
-- The active tenant a bearer token belongs to.
SELECT * FROM tenants WHERE api_token_hash = $1 AND state = 'active';

-- name: lock_tenant
-- Locks the tenant row: quota checks and the insert they guard are serialized per tenant.
SELECT * FROM tenants WHERE tenant_id = $1 FOR UPDATE;

-- name: tenant_usage
-- What counts against a tenant's quotas: its live (active or paused) schedules and their trigger rate
-- (excluding schedule $2, the one being updated, if given).
SELECT count(*) AS schedules, coalesce(sum(fires_per_minute), 0)::double precision AS fires_per_minute
FROM schedules
WHERE tenant_id = $1 AND state IN ('active', 'paused') AND ($2::uuid IS NULL OR schedule_id <> $2::uuid);

-- name: insert_schedule
-- Creates a schedule; with a created_by_key, a second create with the same key is a no-op (returns nothing).
INSERT INTO schedules (
    schedule_id, tenant_id, kind, expression, time_zone, dst_repeat, dst_gap, anchor, start_at, end_at,
    next_run_at, state, target, payload, priority, flexible_window_s, misfire_policy, max_lateness_s,
    overlap_policy, retry_max_attempts, retry_base_s, retry_cap_s, deadline_s, shard, created_by_key,
    fires_per_minute, request_hash, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
        $22, $23, $24, $25, $26, $27, coalesce($28::timestamptz, now()), coalesce($28::timestamptz, now()))
ON CONFLICT (tenant_id, created_by_key) DO NOTHING
RETURNING *;

-- name: get_schedule
-- One schedule of one tenant.
SELECT * FROM schedules WHERE schedule_id = $1 AND tenant_id = $2;

-- name: lock_schedule
-- One schedule of one tenant, locked for a lifecycle change (the materializer skips it meanwhile).
SELECT * FROM schedules WHERE schedule_id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: get_schedule_by_key
-- The schedule a tenant created with an idempotency key.
SELECT * FROM schedules WHERE tenant_id = $1 AND created_by_key = $2;

-- name: replace_schedule
-- Writes a new version of a locked schedule: definition, state and cursor.
UPDATE schedules
SET version = version + 1, kind = $3, expression = $4, time_zone = $5, dst_repeat = $6, dst_gap = $7,
    anchor = $8, start_at = $9, end_at = $10, next_run_at = $11, state = $12, target = $13, payload = $14,
    priority = $15, flexible_window_s = $16, misfire_policy = $17, max_lateness_s = $18, overlap_policy = $19,
    retry_max_attempts = $20, retry_base_s = $21, retry_cap_s = $22, deadline_s = $23, fires_per_minute = $24,
    updated_at = coalesce($25::timestamptz, now())
WHERE schedule_id = $1 AND tenant_id = $2
RETURNING *;

-- name: change_schedule_state
-- A new version of a locked schedule that changes only its state and cursor (pause, resume, cancel).
UPDATE schedules
SET version = version + 1, state = $3, next_run_at = $4, updated_at = coalesce($5::timestamptz, now())
WHERE schedule_id = $1 AND tenant_id = $2
RETURNING *;

-- name: cancel_unclaimed_occurrences
-- Invalidates occurrences of versions older than $2 that no worker has started (SCHEDULED, ENQUEUED,
-- RETRY_WAIT): they become CANCELED and their unsent outbox rows are discarded. An ENQUEUED one already
-- in Kafka is skipped by consumers, which check the schedule's version before the effect.
-- Returns how many were canceled and the earliest instant among those never published (SCHEDULED):
-- only those may be re-materialized later without risking a second run of the same slot.
WITH targets AS (
    SELECT occurrence_id, scheduled_for, state
    FROM occurrences
    WHERE schedule_id = $1 AND schedule_version < $2 AND state IN ('SCHEDULED', 'ENQUEUED', 'RETRY_WAIT')
    FOR UPDATE
), canceled AS (
    UPDATE occurrences o
    SET state = 'CANCELED', updated_at = coalesce($3::timestamptz, now())
    FROM targets t
    WHERE o.occurrence_id = t.occurrence_id
    RETURNING t.occurrence_id, t.scheduled_for, t.state AS was
), discarded AS (
    UPDATE outbox
    SET discarded_at = coalesce($3::timestamptz, now())
    WHERE occurrence_id IN (SELECT occurrence_id FROM canceled) AND sent_at IS NULL AND discarded_at IS NULL
    RETURNING 1
)
SELECT count(*) AS canceled, min(scheduled_for) FILTER (WHERE was = 'SCHEDULED') AS earliest_unpublished
FROM canceled;

-- name: insert_schedule_version
-- Records one version of a schedule in its history.
INSERT INTO schedule_versions (schedule_id, version, tenant_id, change, state, definition, next_run_at,
                               changed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8::timestamptz, now()));

-- name: insert_topic_message
-- Queues a message that belongs to no occurrence (a schedule state, a command result) for the relay,
-- in the transaction of the change it reports.
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                    created_at)
VALUES (NULL, $1, $2, $3, $4, coalesce($5::timestamptz, now()), coalesce($5::timestamptz, now()),
        coalesce($5::timestamptz, now()));

-- name: list_schedules
-- A page of a tenant's schedules in creation order, after the cursor (created_at, schedule_id).
SELECT *
FROM schedules
WHERE tenant_id = $1
  AND ($2::text IS NULL OR state = $2)
  AND ($3::text IS NULL OR target = $3)
  AND ($4::timestamptz IS NULL OR (created_at, schedule_id) > ($4, $5::uuid))
ORDER BY created_at, schedule_id
LIMIT $6;

-- name: list_schedule_occurrences
-- A page of one schedule's occurrences, oldest first, after the cursor (scheduled_for, occurrence_id).
SELECT *
FROM occurrences
WHERE schedule_id = $1 AND tenant_id = $2
  AND ($3::timestamptz IS NULL OR (scheduled_for, occurrence_id) > ($3, $4::uuid))
ORDER BY scheduled_for, occurrence_id
LIMIT $5;

-- name: get_occurrence
-- One occurrence of one tenant.
SELECT * FROM occurrences WHERE occurrence_id = $1 AND tenant_id = $2;

-- name: list_attempts
-- The attempts of one occurrence, in order.
SELECT * FROM attempts WHERE occurrence_id = $1 ORDER BY attempt_number, started_at;

-- name: list_schedule_versions
-- The version history of one schedule.
SELECT * FROM schedule_versions WHERE schedule_id = $1 AND tenant_id = $2 ORDER BY version;

-- name: claim_command
-- Records an authenticated command as being processed; returns nothing if it was processed before
-- (a replay or a redelivery), in which case its stored outcome is answered again.
INSERT INTO processed_commands (command_id, tenant_id, action, outcome, processed_at)
VALUES ($1, $2, $3, '{}'::jsonb, coalesce($4::timestamptz, now()))
ON CONFLICT (command_id) DO NOTHING
RETURNING command_id;

-- name: command_outcome
-- The stored outcome of a processed command.
SELECT tenant_id, outcome FROM processed_commands WHERE command_id = $1;

-- name: record_command_outcome
-- Stores the outcome of a command, in the transaction of its effect.
UPDATE processed_commands SET outcome = $2 WHERE command_id = $1;

-- name: current_database
-- The engine database's name (consumer groups of the engine are named after it).
SELECT current_database();
