-- Runtime queries of the relay (outbox → Kafka).
-- $now is NULL in production (the database's clock rules), a fixed instant in tests.

-- name: claim_due_outbox
-- Claims up to $2 due, unsent rows whose previous claim (if any) has expired, under claim token $3
-- for $4 seconds. Rows are chosen by state, never by "id > last seen": ids commit out of order.
WITH due AS (
    SELECT id
    FROM outbox
    WHERE sent_at IS NULL AND discarded_at IS NULL
      AND available_at <= coalesce($1::timestamptz, now())
      AND (claim_expires_at IS NULL OR claim_expires_at <= coalesce($1::timestamptz, now()))
    ORDER BY available_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
SET claim_token = $3,
    claim_expires_at = coalesce($1::timestamptz, now()) + make_interval(secs => $4),
    publish_attempts = o.publish_attempts + 1
FROM due
WHERE o.id = due.id
RETURNING o.id, o.occurrence_id, o.tenant_id, o.topic, o.message_key, o.message, o.scheduled_for,
          o.available_at;

-- name: mark_outbox_sent
-- Marks rows sent after the broker acknowledged them, only while claim token $3 still holds them
-- (a relay that lost its claim changes nothing), and records the first enqueue on each occurrence.
-- Returns how many rows this claim marked and the instant used.
WITH sent AS (
    UPDATE outbox
    SET sent_at = coalesce($1::timestamptz, now()), claim_token = NULL, claim_expires_at = NULL,
        last_error = NULL
    WHERE id = ANY ($2::bigint[]) AND claim_token = $3 AND sent_at IS NULL
    RETURNING occurrence_id
), enqueued AS (
    UPDATE occurrences o
    SET state = 'ENQUEUED',
        enqueued_at = coalesce(o.enqueued_at, coalesce($1::timestamptz, now())),
        updated_at = coalesce($1::timestamptz, now())
    FROM sent
    WHERE o.occurrence_id = sent.occurrence_id AND o.state IN ('SCHEDULED', 'RETRY_WAIT')
    RETURNING 1
)
SELECT (SELECT count(*) FROM sent) AS marked, coalesce($1::timestamptz, now()) AS marked_at;

-- name: release_outbox_claims
-- Gives rows back after a failed or unknown publish so the next pass retries them at once.
UPDATE outbox
SET claim_token = NULL, claim_expires_at = NULL, last_error = $3
WHERE id = ANY ($1::bigint[]) AND claim_token = $2 AND sent_at IS NULL;

-- name: outbox_backlog
-- Due rows not yet sent.
SELECT count(*)
FROM outbox
WHERE sent_at IS NULL AND discarded_at IS NULL AND available_at <= coalesce($1::timestamptz, now());

