-- History retention (migration 0013): finished occurrences older than their tenant's retention move, with
-- their attempts, from the hot tables into the archive schema; readers union both.
-- "Finished" is engine.rules.occurrence_states.TERMINAL: SUCCEEDED, MISSED, CANCELED, SKIPPED_OVERLAP.
-- DEAD is not in it (an operator may still replay it from the dead-letter list) and stays hot.

-- name: retention_policy
-- The global default retention, in seconds.
SELECT keep_s FROM history_retention;

-- name: set_retention_default
-- Sets the global default retention to :keep_s seconds.
UPDATE history_retention SET keep_s = :keep_s, updated_at = coalesce(:now::timestamptz, now()) RETURNING keep_s;

-- name: set_tenant_retention
-- Sets (or, with NULL, clears) tenant :tenant_id's override of the default retention.
UPDATE tenants SET history_keep_s = :keep_s::bigint WHERE tenant_id = :tenant_id RETURNING tenant_id, history_keep_s;

-- name: retention_cutoffs
-- Per tenant, its retention and the cutoff instant: its finished occurrences scheduled before it may go.
SELECT t.tenant_id,
       coalesce(t.history_keep_s, r.keep_s) AS keep_s,
       t.history_keep_s IS NOT NULL AS overridden,
       coalesce(:now::timestamptz, now()) - make_interval(secs => coalesce(t.history_keep_s, r.keep_s)) AS cutoff,
       coalesce(t.history_keep_s, r.keep_s) < r.keep_s AS shorter
FROM tenants t CROSS JOIN history_retention r
ORDER BY t.tenant_id;

-- name: prunable_summary
-- What a prune's batches would move for tenant :tenant_id (dry run): finished occurrences scheduled before
-- :cutoff that nothing still hands off (no unsent outbox row, no ahead-lane queue row, no open stuck watch),
-- their attempts, and the oldest and newest scheduled_for among them. Rows of the day partitions move with
-- their day (archive_day), so batches take them only when :everywhere (a tenant retention shorter than the
-- default); otherwise only the DEFAULT partition's. Rows of :moving_days, the days the same run moves whole
-- first, are the days' count.
SELECT count(*) AS occurrences,
       coalesce(sum((SELECT count(*) FROM attempts a WHERE a.occurrence_id = o.occurrence_id)), 0)::bigint AS attempts,
       min(o.scheduled_for) AS oldest, max(o.scheduled_for) AS newest
FROM occurrences o
WHERE o.tenant_id = :tenant_id AND o.scheduled_for < :cutoff
  AND o.state IN ('SUCCEEDED', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')
  AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.occurrence_id = o.occurrence_id
                  AND b.sent_at IS NULL AND b.discarded_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.occurrence_id = o.occurrence_id)
  AND NOT EXISTS (SELECT 1 FROM stuck_occurrences s WHERE s.occurrence_id = o.occurrence_id
                  AND s.resolved_at IS NULL)
  AND (:everywhere OR o.tableoid = 'occurrences_default'::regclass)
  AND NOT ((o.scheduled_for AT TIME ZONE 'UTC')::date = ANY (:moving_days::date[]));

-- name: kept_summary
-- What stays hot for tenant :tenant_id although scheduled before :cutoff: not final (or DEAD), or still in a
-- handoff; counted by state. Finished rows come by tenant and age (occurrences_finished_by_tenant), open ones
-- from occurrences_open (migration 0029: the tenant's index holds finished occurrences only).
SELECT k.state, count(*) AS occurrences
FROM (
    SELECT o.state
    FROM occurrences o
    WHERE o.tenant_id = :tenant_id AND o.scheduled_for < :cutoff
      AND o.state IN ('SUCCEEDED', 'DEAD', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')
      AND (o.state = 'DEAD'
           OR EXISTS (SELECT 1 FROM outbox b WHERE b.occurrence_id = o.occurrence_id
                      AND b.sent_at IS NULL AND b.discarded_at IS NULL)
           OR EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.occurrence_id = o.occurrence_id)
           OR EXISTS (SELECT 1 FROM stuck_occurrences s WHERE s.occurrence_id = o.occurrence_id
                      AND s.resolved_at IS NULL))
    UNION ALL
    SELECT o.state
    FROM occurrences o
    WHERE o.tenant_id = :tenant_id AND o.scheduled_for < :cutoff
      AND o.state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
) k
GROUP BY k.state ORDER BY k.state;

-- name: lock_prunable_batch
-- Locks up to :limit of tenant :tenant_id's prunable occurrences (as in prunable_summary), oldest first.
-- FOR UPDATE re-checks the state on the locked row: an occurrence a replay or backfill moved on meanwhile
-- is not taken, and anything that would add an outbox row or attempt to a locked one waits for this batch
-- and then finds it gone. SKIP LOCKED: two pruners never wait for each other and never take the same row.
SELECT o.occurrence_id
FROM occurrences o
WHERE o.tenant_id = :tenant_id AND o.scheduled_for < :cutoff
  AND o.state IN ('SUCCEEDED', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')
  AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.occurrence_id = o.occurrence_id
                  AND b.sent_at IS NULL AND b.discarded_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.occurrence_id = o.occurrence_id)
  AND NOT EXISTS (SELECT 1 FROM stuck_occurrences s WHERE s.occurrence_id = o.occurrence_id
                  AND s.resolved_at IS NULL)
  AND (:everywhere OR o.tableoid = 'occurrences_default'::regclass)
ORDER BY o.scheduled_for
LIMIT :limit
FOR UPDATE OF o SKIP LOCKED;

-- name: archive_attempts
-- Moves the attempts of occurrences :occurrence_ids into the archive (same transaction as the occurrences).
WITH moved AS (
    DELETE FROM attempts WHERE occurrence_id = ANY(:occurrence_ids::uuid[]) RETURNING *
), archived AS (
    INSERT INTO archive.attempts SELECT * FROM moved RETURNING 1
)
SELECT count(*) FROM archived;

-- name: forget_delivered_handoffs
-- Deletes the delivered (sent or discarded) outbox rows and the resolved stuck watches of occurrences
-- :occurrence_ids: their message is in Kafka, the occurrence row keeps the outcome. Returns the outbox rows.
WITH outbox_rows AS (
    DELETE FROM outbox WHERE occurrence_id = ANY(:occurrence_ids::uuid[]) RETURNING 1
), watches AS (
    DELETE FROM stuck_occurrences WHERE occurrence_id = ANY(:occurrence_ids::uuid[]) RETURNING 1
)
SELECT (SELECT count(*) FROM outbox_rows) AS outbox, (SELECT count(*) FROM watches) AS watches;

-- name: archive_occurrences
-- Moves occurrences :occurrence_ids into the archive (after their attempts and handoff rows); how many, and
-- the oldest and newest scheduled_for among them.
WITH moved AS (
    DELETE FROM occurrences WHERE occurrence_id = ANY(:occurrence_ids::uuid[]) RETURNING *
), archived AS (
    INSERT INTO archive.occurrences SELECT * FROM moved RETURNING scheduled_for
)
SELECT count(*) AS occurrences, min(scheduled_for) AS oldest, max(scheduled_for) AS newest FROM archived;

-- name: advance_archive_horizon
-- Records that tenant :tenant_id's finished occurrences scheduled before :cutoff may be archived.
INSERT INTO archive.horizons (tenant_id, archived_before, updated_at)
VALUES (:tenant_id, :cutoff, coalesce(:now::timestamptz, now()))
ON CONFLICT (tenant_id) DO UPDATE
SET archived_before = greatest(archive.horizons.archived_before, excluded.archived_before),
    updated_at = excluded.updated_at;
