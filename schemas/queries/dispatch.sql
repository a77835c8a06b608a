-- The ahead lane: seal, read in key order, move the cursor once per page (relay/ahead_lane.py), and the
-- settle pass that records ENQUEUED from the dispatch log off the hot path (engine/loops/dispatch_settler.py).
-- $now is NULL in production (the database's clock rules), a fixed instant in tests. Every write for a
-- shard is conditional on the lease (owner, epoch) the writer holds.

-- name: current_instant
-- The one clock: the injected instant if given, else the database's now().
SELECT coalesce($1::timestamptz, now());

-- name: seal_lanes
-- Seals lane $5 of node $4's shards $1 (at epochs $2) up to $3: waits for open materializer transactions on
-- them (they hold the seal FOR SHARE), so once this commits every ahead row before the seal is visible.
-- Returns each sealed shard's seal (never moved back) and the database instant.
UPDATE dispatch_seals s
SET sealed_until = greatest(s.sealed_until, $3::timestamptz)
FROM shard_leases l, unnest($1::int[], $2::bigint[]) AS mine (shard, epoch)
WHERE s.shard = mine.shard AND s.lane = $5 AND l.shard = mine.shard AND l.epoch = mine.epoch AND l.owner = $4
RETURNING s.shard, s.sealed_until, coalesce($6::timestamptz, now()) AS now;

-- name: cursor_positions
-- Where lane $2 of shards $1 stands: the key of the last acknowledged row.
SELECT shard, published_bucket, published_round, published_id
FROM dispatch_cursors
WHERE shard = ANY ($1::int[]) AND lane = $2;

-- name: read_ahead_page
-- The next rows of lane $6, per shard: up to $7 rows after each shard's cursor ($2, $3, $4) and before its
-- seal ($5), ordered by shard then key (bucket, weighted round, occurrence_id), with the identity
-- headers' values already as bytes. Discarded rows are returned too (the cursor passes them; the relay
-- does not publish them).
SELECT q.shard, q.bucket, q.wrr_round, q.occurrence_id, q.tenant_id, q.topic, q.message_key, q.message,
       q.scheduled_for, q.available_at, q.discarded_at IS NOT NULL AS discarded,
       convert_to(q.occurrence_id::text, 'UTF8') AS occurrence_header, convert_to(q.tenant_id, 'UTF8') AS tenant_header
FROM unnest($1::int[], $2::timestamptz[], $3::int[], $4::uuid[], $5::timestamptz[])
     AS c (shard, bucket, wrr_round, occurrence_id, sealed_until)
CROSS JOIN LATERAL (
    SELECT *
    FROM dispatch_queue q
    WHERE q.shard = c.shard AND q.lane = $6
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (c.bucket, c.wrr_round, c.occurrence_id)
      AND q.bucket < c.sealed_until
    ORDER BY q.bucket, q.wrr_round, q.occurrence_id
    LIMIT $7
) q
ORDER BY q.shard, q.bucket, q.wrr_round, q.occurrence_id;

-- name: advance_cursors
-- After the broker acknowledged a page: moves lane $12 of node $11's shards $1 (epochs $2) from keys
-- ($3, $4, $5) to keys ($6, $7, $8) covering $9 rows, and logs each move with the acknowledgement instant
-- (the occurrences' enqueued_at). A shard whose epoch moved on (another owner) is left alone. Returns how
-- many cursors moved and the instant.
WITH moved AS (
    UPDATE dispatch_cursors c
    SET published_bucket = m.to_bucket, published_round = m.to_round, published_id = m.to_id, epoch = m.epoch,
        updated_at = coalesce($10::timestamptz, now())
    FROM shard_leases l,
         unnest($1::int[], $2::bigint[], $3::timestamptz[], $4::int[], $5::uuid[], $6::timestamptz[], $7::int[],
                $8::uuid[], $9::int[])
         AS m (shard, epoch, from_bucket, from_round, from_id, to_bucket, to_round, to_id, rows)
    WHERE c.shard = m.shard AND c.lane = $12 AND l.shard = m.shard AND l.epoch = m.epoch AND l.owner = $11
      AND (c.published_bucket, c.published_round, c.published_id) < (m.to_bucket, m.to_round, m.to_id)
    RETURNING m.*
), logged AS (
    INSERT INTO dispatch_log (shard, lane, epoch, from_bucket, from_round, from_id, to_bucket, to_round, to_id,
                              rows, acked_at)
    SELECT shard, $12, epoch, from_bucket, from_round, from_id, to_bucket, to_round, to_id, rows,
           coalesce($10::timestamptz, now())
    FROM moved
    RETURNING 1
)
SELECT (SELECT count(*) FROM logged) AS moved, coalesce($10::timestamptz, now()) AS acked_at;

-- name: quarantine_rows
-- Sets aside deliveries the broker refused for good after bounded tries (the cursor passes them).
INSERT INTO dispatch_quarantine (occurrence_id, shard, lane, tenant_id, topic, error, tries, quarantined_at)
SELECT * , coalesce($8::timestamptz, now())
FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[])
ON CONFLICT (occurrence_id, topic) DO UPDATE SET error = excluded.error, tries = excluded.tries;

-- name: ahead_backlog
-- Ahead-lane rows due (available_at <= now) and not yet passed by their cursor, per lane.
SELECT q.lane, count(*) AS due
FROM dispatch_queue q
JOIN dispatch_cursors c ON c.shard = q.shard AND c.lane = q.lane
WHERE q.available_at <= coalesce($1::timestamptz, now())
  AND (q.bucket, q.wrr_round, q.occurrence_id) > (c.published_bucket, c.published_round, c.published_id)
GROUP BY q.lane;

-- name: settle_logged_pages
-- Off the hot path: takes up to $1 unsettled log entries (oldest first), records ENQUEUED and enqueued_at
-- (the acknowledgement instant) on their SCHEDULED occurrences, deletes their queue rows and marks the
-- entries settled. SKIP LOCKED: several settlers never wait for each other. Returns the entries and rows
-- settled and each enqueued occurrence's schedule_lag (enqueued_at - scheduled_for, seconds).
WITH entries AS (
    SELECT * FROM dispatch_log WHERE settled_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), published AS (
    DELETE FROM dispatch_queue q
    USING entries e
    WHERE q.shard = e.shard AND q.lane = e.lane
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (e.from_bucket, e.from_round, e.from_id)
      AND (q.bucket, q.wrr_round, q.occurrence_id) <= (e.to_bucket, e.to_round, e.to_id)
    RETURNING q.occurrence_id, q.discarded_at, e.acked_at
), enqueued AS (
    UPDATE occurrences o
    SET state = CASE WHEN o.state = 'SCHEDULED' THEN 'ENQUEUED' ELSE o.state END,
        enqueued_at = coalesce(o.enqueued_at, p.acked_at),
        updated_at = coalesce($2::timestamptz, now())
    FROM published p
    WHERE o.occurrence_id = p.occurrence_id AND p.discarded_at IS NULL
      AND (o.state = 'SCHEDULED' OR o.enqueued_at IS NULL)
    RETURNING extract(epoch FROM o.enqueued_at - o.scheduled_for)::float8 AS lag
), settled AS (
    UPDATE dispatch_log l SET settled_at = coalesce($2::timestamptz, now())
    FROM entries e WHERE l.id = e.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM settled) AS entries, (SELECT count(*) FROM published) AS rows,
       coalesce((SELECT array_agg(lag) FROM enqueued), '{}') AS lags;

-- name: prune_settled_log
-- Forgets settled log entries older than $1 seconds.
DELETE FROM dispatch_log WHERE settled_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1);
