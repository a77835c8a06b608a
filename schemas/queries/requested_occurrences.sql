-- Occurrences a principal asks for outside the schedule's own firing: backfill and trigger now
-- (engine/control/requested_occurrences.py). :now is NULL in production, a fixed instant in tests.

-- name: lock_refire_candidates
-- Locks the hot occurrences of one schedule at the given instants that a backfill may fire again (MISSED,
-- SKIPPED_OVERLAP): the history pruner skips locked rows, so none of them moves to the archive between the
-- backfill's read and its refire. One the pruner is moving right now is waited for, then read from the archive.
SELECT occurrence_id
FROM occurrences
WHERE schedule_id = :schedule_id AND scheduled_for = ANY (:slots::timestamptz[]) AND origin <> 'manual'
  AND state IN ('MISSED', 'SKIPPED_OVERLAP')
FOR UPDATE;

-- name: slot_occurrences
-- The slot occurrences (not manual ones) of one schedule at the given instants, of any version, hot and
-- archived (one statement, one snapshot: the pruner's move is one transaction, so each is read exactly once).
SELECT occurrence_id, schedule_version, scheduled_for, state, false AS archived
FROM occurrences
WHERE schedule_id = :schedule_id AND scheduled_for = ANY (:slots::timestamptz[]) AND origin <> 'manual'
UNION ALL
SELECT occurrence_id, schedule_version, scheduled_for, state, true AS archived
FROM archive.occurrences
WHERE schedule_id = :schedule_id AND scheduled_for = ANY (:slots::timestamptz[]) AND origin <> 'manual';

-- name: restore_archived_occurrences
-- Moves archived occurrences :occurrence_ids of one schedule version that never ran (MISSED,
-- SKIPPED_OVERLAP) back to the hot table, with any attempts, so that a backfill fires them again under their
-- own ids (refire_occurrences, next). Returns how many occurrences were restored.
WITH moved AS (
    DELETE FROM archive.occurrences
    WHERE occurrence_id = ANY (:occurrence_ids::uuid[]) AND schedule_id = :schedule_id
      AND schedule_version = :version AND tenant_id = :tenant_id AND state IN ('MISSED', 'SKIPPED_OVERLAP')
    RETURNING *
), restored AS (
    -- a slot held in the hot table meanwhile is not taken twice: fewer restored than moved, and the caller
    -- rolls the whole backfill back (the archive keeps them)
    INSERT INTO occurrences SELECT * FROM moved ON CONFLICT DO NOTHING RETURNING occurrence_id
), attempts_moved AS (
    DELETE FROM archive.attempts WHERE occurrence_id IN (SELECT occurrence_id FROM moved) RETURNING *
), attempts_restored AS (
    INSERT INTO attempts SELECT * FROM attempts_moved RETURNING 1
)
SELECT (SELECT count(*) FROM restored) AS occurrences, (SELECT count(*) FROM attempts_restored) AS attempts;

-- name: lock_catch_up_clock
-- Locks the tenant's catch-up clock (created a minute behind now: an idle tenant may burst one minute's quota).
INSERT INTO tenant_catch_up AS c (tenant_id, free_at)
VALUES (:tenant_id, coalesce(:now::timestamptz, now()) - interval '1 minute')
ON CONFLICT (tenant_id) DO UPDATE SET free_at = c.free_at
RETURNING free_at;

-- name: set_catch_up_clock
-- Moves the tenant's catch-up clock past the slots just released.
UPDATE tenant_catch_up SET free_at = :free_at WHERE tenant_id = :tenant_id;

-- name: insert_requested_occurrences
-- Inserts requested occurrences (SCHEDULED, :origin, requested by :requested_by) of one schedule and, for each
-- one actually inserted, its outbox row: held by the overlap gate (:held, claim :gate_token) or free for the
-- relay. The outbox row's scheduled_for is the release instant, so schedule_lag measures delivery against the
-- release, not against a slot hours in the past. Returns how many were inserted.
WITH input AS (
    SELECT * FROM unnest(:occurrence_ids::uuid[], :slots::timestamptz[], :releases::timestamptz[],
                         :messages::bytea[]) AS t(occurrence_id, scheduled_for, available_at, message)
), inserted AS (
    INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                             available_at, state, origin, requested_by, created_at, updated_at)
    SELECT occurrence_id, :schedule_id, :version, :tenant_id, :target, scheduled_for, available_at, 'SCHEDULED',
           :origin, :requested_by, coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now())
    FROM input
    ON CONFLICT DO NOTHING
    RETURNING occurrence_id
), outboxed AS (
    INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                        claim_token, claim_expires_at, created_at)
    SELECT i.occurrence_id, :tenant_id, :topic, :message_key, i.message, i.available_at, i.available_at,
           CASE WHEN :held::bool THEN :gate_token::uuid END,
           CASE WHEN :held::bool THEN 'infinity'::timestamptz END, coalesce(:now::timestamptz, now())
    FROM input i JOIN inserted USING (occurrence_id)
    RETURNING 1
)
SELECT count(*) FROM inserted;

-- name: refire_occurrences
-- Fires again occurrences of the current version that never ran (MISSED, SKIPPED_OVERLAP): the same
-- occurrence id back to SCHEDULED (:origin, requested by :requested_by) with a new outbox row, held like
-- insert_requested_occurrences. Returns how many were refired.
WITH input AS (
    SELECT * FROM unnest(:occurrence_ids::uuid[], :slots::timestamptz[], :releases::timestamptz[],
                         :messages::bytea[]) AS t(occurrence_id, scheduled_for, available_at, message)
), refired AS (
    UPDATE occurrences o
    SET state = 'SCHEDULED', origin = :origin, requested_by = :requested_by, available_at = i.available_at,
        finished_at = NULL, updated_at = coalesce(:now::timestamptz, now())
    FROM input i
    WHERE o.occurrence_id = i.occurrence_id AND o.schedule_id = :schedule_id AND o.schedule_version = :version
      AND o.tenant_id = :tenant_id AND o.target = :target AND o.state IN ('MISSED', 'SKIPPED_OVERLAP')
    RETURNING o.occurrence_id
), outboxed AS (
    INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                        claim_token, claim_expires_at, created_at)
    SELECT i.occurrence_id, :tenant_id, :topic, :message_key, i.message, i.available_at, i.available_at,
           CASE WHEN :held::bool THEN :gate_token::uuid END,
           CASE WHEN :held::bool THEN 'infinity'::timestamptz END, coalesce(:now::timestamptz, now())
    FROM input i JOIN refired USING (occurrence_id)
    RETURNING 1
)
SELECT count(*) FROM refired;

-- name: requested_occurrence
-- One occurrence of one schedule (the result of a trigger-now), hot or archived. By id alone: the table's key
-- is (occurrence_id, scheduled_for), and a retried trigger asks at a later instant than the one it created.
SELECT * FROM occurrences WHERE occurrence_id = :occurrence_id AND schedule_id = :schedule_id
UNION ALL
SELECT * FROM archive.occurrences WHERE occurrence_id = :occurrence_id AND schedule_id = :schedule_id
LIMIT 1;
