-- Runtime queries of the consumer runtime, run against the consumer app's OWN database.

-- name: limit_transaction
-- Bounds the attempt's transaction by its lease: a transaction left idle longer than :idle_timeout_ms
-- (a worker paused or stalled past its lease) is ended by the server, releasing its dedupe row lock, and a
-- wait for another worker's dedupe row lock gives up after :lock_timeout_ms. Both settings last until the
-- transaction ends.
SELECT set_config('lock_timeout', :lock_timeout_ms::text, true),
       set_config('idle_in_transaction_session_timeout', :idle_timeout_ms::text, true);

-- name: insert_dedupe
-- Records that this consumer group applies an occurrence, in the transaction of the effect, with the
-- delivery number and lease token of the attempt that applies it. Returns a row only for the first
-- application; a redelivery (or a concurrent twin, which waits for the first transaction) gets nothing
-- back and must not apply the effect. claim_order is this transaction's id: increasing, so the engine can
-- tell a later claim of the same delivery (a takeover) from a stalled earlier one. :slot: the occurrence is
-- its slot's own (its id is the slot's); only those hold the slot, so a manual run on a slot instant is not
-- taken for the slot's occurrence (consumer migration 0004).
INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version, tenant_id,
                                     scheduled_for, attempt, lease_token, slot)
VALUES (:consumer_group, :occurrence_id, :schedule_id, :schedule_version, :tenant_id, :scheduled_for, :attempt,
        :lease_token, :slot)
ON CONFLICT DO NOTHING
RETURNING applied_at, pg_current_xact_id()::text::bigint AS claim_order;

-- name: dedupe_row
-- Which attempt applied the occurrence for this group (nothing if it was not applied).
SELECT applied_at, attempt, lease_token FROM chronoq_consumer_dedupe
WHERE consumer_group = :consumer_group AND occurrence_id = :occurrence_id;

-- name: ping
-- Whether the app database answers (tells an outage from a session that ended on its own). In an open
-- transaction it also restarts the idle-in-transaction timer (a delivery asking the engine again).
SELECT 1;

-- name: effects_in_window
-- The dedupe rows (effects applied) whose slot falls in :window_from .. :window_to, of one tenant and one
-- consumer group if given: what the engine's reconciler compares with its occurrences.
SELECT consumer_group, occurrence_id, schedule_id, schedule_version, scheduled_for
FROM chronoq_consumer_dedupe
WHERE scheduled_for >= :window_from AND scheduled_for < :window_to
  AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id) AND (:group::text IS NULL OR consumer_group = :group);

-- name: insert_dedupe_batch
-- A batch handler's dedupe rows, one statement for the batch: :rows is a JSON array with one object per
-- occurrence this group applies in the transaction of the batch's effects, keyed by column. :checked: returns
-- the occurrences inserted now; the others were applied before (or by a concurrent twin, which this waits for)
-- and must not reach the handler. Not :checked: a row applied before fails the statement (unique_violation)
-- instead. The runtime runs it unchecked first, under a savepoint, and checked after a refusal: a
-- speculative insert (ON CONFLICT) probes each unique index once more per row and confirms each row, for
-- the redeliveries a batch rarely holds (docs/benchmarks.md, stop 58).
WITH new_rows AS NOT MATERIALIZED (
    SELECT :consumer_group AS consumer_group, occurrence_id, schedule_id, schedule_version, tenant_id, scheduled_for,
           attempt, lease_token, slot
    FROM jsonb_to_recordset(:rows::text::jsonb)
         AS r (occurrence_id uuid, schedule_id uuid, schedule_version integer, tenant_id text,
               scheduled_for timestamptz, attempt integer, lease_token uuid, slot boolean)
), checked AS (
    INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version, tenant_id,
                                         scheduled_for, attempt, lease_token, slot)
    SELECT * FROM new_rows WHERE :checked::boolean
    ON CONFLICT DO NOTHING
    RETURNING occurrence_id, applied_at
), unchecked AS (
    INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version, tenant_id,
                                         scheduled_for, attempt, lease_token, slot)
    SELECT * FROM new_rows WHERE NOT :checked::boolean
    RETURNING occurrence_id, applied_at
)
SELECT occurrence_id, applied_at, pg_current_xact_id()::text::bigint AS claim_order
FROM (SELECT * FROM checked UNION ALL SELECT * FROM unchecked) AS inserted;

-- name: dedupe_rows
-- Which attempts applied the occurrences :occurrence_ids for this group (those that were applied).
SELECT occurrence_id, applied_at, attempt, lease_token FROM chronoq_consumer_dedupe
WHERE consumer_group = :consumer_group AND occurrence_id = ANY (:occurrence_ids::uuid[]);

-- name: delete_dedupe_rows
-- Takes back, inside the batch's transaction, the dedupe rows it inserted for occurrences that became
-- obsolete before the handler ran (they are not applied; their rows never commit).
DELETE FROM chronoq_consumer_dedupe
WHERE consumer_group = :consumer_group AND occurrence_id = ANY (:occurrence_ids::uuid[])
  AND lease_token = ANY (:lease_tokens::uuid[]);
