-- Queries of the stuck-occurrence pass (engine/loops/stuck_occurrences.py): occurrences published whose
-- attempt events never arrived. :now is the pass's current_instant.

-- name: claim_stuck_occurrences
-- Up to :limit occurrences ENQUEUED for longer than :timeout_s seconds that are due for another look: never
-- seen, or redelivered, not flagged, and quiet for :timeout_s * 2^redeliveries seconds since. SKIP LOCKED: an
-- occurrence the attempt processor is applying an event to right now is not stuck.
SELECT o.occurrence_id, o.schedule_id, o.tenant_id, o.updated_at, coalesce(s.redeliveries, 0) AS redeliveries,
       s.first_seen_at
FROM occurrences o
LEFT JOIN stuck_occurrences s ON s.occurrence_id = o.occurrence_id AND s.resolved_at IS NULL
WHERE o.state = 'ENQUEUED'
  AND o.updated_at < :now::timestamptz - make_interval(secs => :timeout_s)
  AND (s.occurrence_id IS NULL
       OR (s.flagged_at IS NULL
           AND s.last_redelivered
               < :now::timestamptz - make_interval(secs => :timeout_s * power(2, s.redeliveries))))
ORDER BY o.updated_at
LIMIT :limit
FOR UPDATE OF o SKIP LOCKED;

-- name: redeliver_occurrence
-- Publishes the occurrence again: a copy of its latest outbox row, due now (same occurrence_id and
-- message, so a consumer that applied it finds its dedupe row and reports already_applied). Returns
-- nothing when the occurrence has no outbox message to copy.
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at, created_at)
SELECT occurrence_id, tenant_id, topic, message_key, message, scheduled_for, :now::timestamptz,
       :now::timestamptz
FROM outbox
WHERE occurrence_id = :occurrence_id
ORDER BY id DESC
LIMIT 1
RETURNING id;

-- name: record_redelivery
-- Counts one redelivery of a stuck occurrence (first seen now if it was not watched yet).
INSERT INTO stuck_occurrences (occurrence_id, first_seen_at, redeliveries, last_redelivered)
VALUES (:occurrence_id, :now::timestamptz, 1, :now::timestamptz)
ON CONFLICT (occurrence_id) DO UPDATE
SET redeliveries = stuck_occurrences.redeliveries + 1, last_redelivered = excluded.last_redelivered,
    resolved_at = NULL, flagged_at = NULL;

-- name: flag_stuck_occurrence
-- Redeliveries exhausted (or nothing to redeliver): the occurrence is flagged for an operator.
INSERT INTO stuck_occurrences (occurrence_id, first_seen_at, flagged_at)
VALUES (:occurrence_id, :now::timestamptz, :now::timestamptz)
ON CONFLICT (occurrence_id) DO UPDATE SET flagged_at = excluded.flagged_at, resolved_at = NULL;

-- name: resolve_stuck_occurrences
-- Watched occurrences that left ENQUEUED (an attempt event arrived): resolved. Returns how many.
WITH resolved AS (
    UPDATE stuck_occurrences s
    SET resolved_at = :now::timestamptz
    FROM occurrences o
    WHERE s.occurrence_id = o.occurrence_id AND s.resolved_at IS NULL AND o.state <> 'ENQUEUED'
    RETURNING 1
)
SELECT count(*) FROM resolved;

-- name: stuck_counts
-- Stuck occurrences being watched (redelivered, waiting) and flagged.
SELECT count(*) FILTER (WHERE flagged_at IS NULL) AS watched, count(*) FILTER (WHERE flagged_at IS NOT NULL) AS flagged
FROM stuck_occurrences WHERE resolved_at IS NULL;
