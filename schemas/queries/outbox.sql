-- The outbox: messages queued in the transaction of the change they report, published by the relay.
-- :now is NULL in production (the database's clock rules), a fixed instant in tests.

-- name: claim_due_outbox
-- Claims up to :limit due, unsent rows whose previous claim (if any) has expired, under claim token :token
-- for :claim_ttl_s seconds. Rows are chosen by state, never by "id > last seen": ids commit out of order.
-- A message of no occurrence (a schedule state, a target binding, a command result) is claimed only when
-- no older unsent message with its topic and key exists: compaction keeps a key's LAST record, so one
-- key's messages must reach the broker in the order they were written (a schedule's changes are
-- serialised by its row lock, so id order is version order), even with several relays and retries.
WITH due AS (
    SELECT id
    FROM outbox o
    WHERE sent_at IS NULL AND discarded_at IS NULL
      AND available_at <= coalesce(:now::timestamptz, now())
      AND (claim_expires_at IS NULL OR claim_expires_at <= coalesce(:now::timestamptz, now()))
      AND (o.occurrence_id IS NOT NULL OR NOT EXISTS (
          SELECT 1
          FROM outbox older
          WHERE older.occurrence_id IS NULL AND older.sent_at IS NULL AND older.discarded_at IS NULL
            AND older.topic = o.topic AND older.message_key = o.message_key AND older.id < o.id
      ))
    ORDER BY available_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
SET claim_token = :token,
    claim_expires_at = coalesce(:now::timestamptz, now()) + make_interval(secs => :claim_ttl_s),
    publish_attempts = o.publish_attempts + 1
FROM due
WHERE o.id = due.id
RETURNING o.id, o.occurrence_id, o.tenant_id, o.topic, o.message_key, o.message, o.scheduled_for,
          o.available_at, o.late_after, o.misfire_policy, coalesce(:now::timestamptz, now()) AS claimed_at;

-- name: late_outbox_candidates
-- Lateness at dispatch in the late lane: for the schedules of the late rows :ids that claim :token holds,
-- every due, unsent row of their SCHEDULED occurrences still to be judged (late_after set) that no other
-- relay's live claim holds, plus the rows :ids themselves whatever their state; locked, so that the
-- verdict and its write happen together.
WITH schedules_of AS (
    SELECT DISTINCT oc.schedule_id
    FROM outbox o
    JOIN occurrences oc ON oc.occurrence_id = o.occurrence_id
    WHERE o.id = ANY (:ids::bigint[])
)
SELECT o.id, oc.schedule_id, o.available_at, o.late_after, o.misfire_policy,
       (o.sent_at IS NOT NULL OR o.discarded_at IS NOT NULL) AS done
FROM schedules_of s
JOIN occurrences oc ON oc.schedule_id = s.schedule_id AND oc.state = 'SCHEDULED'
JOIN outbox o ON o.occurrence_id = oc.occurrence_id
WHERE o.available_at <= coalesce(:now::timestamptz, now())
  AND (o.id = ANY (:ids::bigint[])
       OR (o.sent_at IS NULL AND o.discarded_at IS NULL AND o.late_after IS NOT NULL
           AND (o.claim_token IS NULL OR o.claim_token = :token
                OR o.claim_expires_at <= coalesce(:now::timestamptz, now()))))
ORDER BY o.id
FOR UPDATE OF o;

-- name: judge_outbox_rows
-- Applies the verdict of lateness at dispatch: rows :missed_ids are discarded (never published) and
-- their SCHEDULED occurrences recorded MISSED; rows :kept_ids are published although late (the policy
-- allows them) and never judged again. Returns the rows discarded.
WITH missed AS (
    UPDATE outbox
    SET discarded_at = coalesce(:now::timestamptz, now()), claim_token = NULL, claim_expires_at = NULL
    WHERE id = ANY (:missed_ids::bigint[]) AND sent_at IS NULL AND discarded_at IS NULL
    RETURNING id, occurrence_id
), kept AS (
    UPDATE outbox SET late_after = NULL WHERE id = ANY (:kept_ids::bigint[]) AND sent_at IS NULL
    RETURNING 1
), recorded AS (
    UPDATE occurrences o SET state = 'MISSED', updated_at = coalesce(:now::timestamptz, now())
    FROM missed
    WHERE o.occurrence_id = missed.occurrence_id AND o.state = 'SCHEDULED'
    RETURNING 1
)
SELECT coalesce((SELECT array_agg(id) FROM missed), '{}') AS missed_ids, (SELECT count(*) FROM kept) AS kept,
       (SELECT count(*) FROM recorded) AS recorded;

-- name: mark_outbox_sent
-- Marks rows sent after the broker acknowledged them, only while claim token :token still holds them
-- (a relay that lost its claim changes nothing), and records the first enqueue on each occurrence.
-- A row discarded while its publish was in flight (a schedule change, a finished occurrence) is marked
-- sent too — it is in the broker, and that is the fact a later change must see — but never moves its
-- occurrence: only a live delivery makes an occurrence ENQUEUED.
-- Returns how many rows this claim marked and the instant used.
WITH sent AS (
    UPDATE outbox
    SET sent_at = coalesce(:now::timestamptz, now()), claim_token = NULL, claim_expires_at = NULL,
        last_error = NULL
    WHERE id = ANY (:ids::bigint[]) AND claim_token = :token AND sent_at IS NULL
    RETURNING occurrence_id, discarded_at
), enqueued AS (
    UPDATE occurrences o
    SET state = 'ENQUEUED',
        enqueued_at = coalesce(o.enqueued_at, coalesce(:now::timestamptz, now())),
        updated_at = coalesce(:now::timestamptz, now())
    FROM sent
    WHERE o.occurrence_id = sent.occurrence_id AND sent.discarded_at IS NULL
      AND o.state IN ('SCHEDULED', 'RETRY_WAIT')
    RETURNING 1
)
SELECT (SELECT count(*) FROM sent) AS marked, coalesce(:now::timestamptz, now()) AS marked_at;

-- name: release_outbox_claims
-- Gives rows back after a failed or unknown publish so the next pass retries them at once.
UPDATE outbox
SET claim_token = NULL, claim_expires_at = NULL, last_error = :error
WHERE id = ANY (:ids::bigint[]) AND claim_token = :token AND sent_at IS NULL;

-- name: outbox_backlog
-- Due rows not yet sent.
SELECT count(*)
FROM outbox
WHERE sent_at IS NULL AND discarded_at IS NULL AND available_at <= coalesce(:now::timestamptz, now());

-- name: insert_outbox_row
-- Queues one message of an occurrence for the relay in the caller's transaction (a retry, a replay or a
-- dead letter), due at :due. scheduled_for is the row's own due instant, so the relay's schedule_lag
-- measures its publication delay.
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                    created_at)
VALUES (:occurrence_id, :tenant_id, :topic, :message_key, :message, :due, :due, coalesce(:now::timestamptz, now()));

-- name: insert_topic_message
-- Queues a message that belongs to no occurrence (a schedule state, a command result) for the relay,
-- in the transaction of the change it reports.
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                    created_at)
VALUES (NULL, :tenant_id, :topic, :message_key, :message, coalesce(:now::timestamptz, now()),
        coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()));

-- name: latest_occurrence_message
-- The last occurrence message written for an occurrence on its topic (retries re-send it with a new
-- attempt number).
SELECT message FROM outbox WHERE occurrence_id = :occurrence_id AND topic = :topic ORDER BY id DESC LIMIT 1;

-- name: discard_pending_deliveries
-- An occurrence that finished needs no further delivery: drop its unsent rows on its occurrence topic.
UPDATE outbox
SET discarded_at = coalesce(:now::timestamptz, now())
WHERE occurrence_id = :occurrence_id AND topic = :topic AND sent_at IS NULL AND discarded_at IS NULL;

-- name: discard_pending_deliveries_of
-- Occurrences that finished (element i of :occurrence_ids, on its occurrence topic :topics[i]) need no further
-- delivery: drop their unsent rows.
UPDATE outbox o
SET discarded_at = coalesce(:now::timestamptz, now())
FROM unnest(:occurrence_ids::uuid[], :topics::text[]) AS f (occurrence_id, topic)
WHERE o.occurrence_id = f.occurrence_id AND o.topic = f.topic AND o.occurrence_id = ANY (:occurrence_ids::uuid[])
  AND o.sent_at IS NULL AND o.discarded_at IS NULL;

-- name: refuse_outbox_rows
-- Gives back rows the broker refused for a reason about the row itself (too large, invalid or unauthorized
-- topic): one more such refusal counted, and the next try not before :retry_after_s seconds from now, so a
-- refused row never heads the next pass. Returns each row's refusals so far.
UPDATE outbox
SET claim_token = NULL, claim_expires_at = NULL, last_error = :error, poison_failures = poison_failures + 1,
    available_at = greatest(available_at, coalesce(:now::timestamptz, now()) + make_interval(secs => :retry_after_s))
WHERE id = ANY (:ids::bigint[]) AND claim_token = :token AND sent_at IS NULL
RETURNING id, poison_failures;

-- name: quarantine_outbox_rows
-- Gives up on rows refused too often: they are never claimed again (discarded, quarantined), and each
-- occurrence whose delivery this was and that still waited for it (SCHEDULED, RETRY_WAIT) goes DEAD with
-- reason 'unpublishable' and the broker's error, so it shows in the dead-letter list and can be replayed.
-- Returns the occurrences that went DEAD.
WITH quarantined AS (
    UPDATE outbox
    SET discarded_at = coalesce(:now::timestamptz, now()), quarantined_at = coalesce(:now::timestamptz, now()),
        last_error = :error
    WHERE id = ANY (:ids::bigint[]) AND sent_at IS NULL AND discarded_at IS NULL
    RETURNING occurrence_id, topic
)
UPDATE occurrences o
SET state = 'DEAD', finished_at = coalesce(:now::timestamptz, now()), lease_token = NULL, lease_expires_at = NULL,
    dead_reason = 'unpublishable', last_error_class = :error_class, last_error_message = :error,
    updated_at = coalesce(:now::timestamptz, now())
FROM quarantined q
WHERE o.occurrence_id = q.occurrence_id AND starts_with(q.topic, :occurrence_topic_prefix)
  AND o.state IN ('SCHEDULED', 'RETRY_WAIT')
RETURNING o.occurrence_id, o.tenant_id, o.target;
