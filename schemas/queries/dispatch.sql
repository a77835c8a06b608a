-- The ahead lane: seal, read in key order, move the cursor once per page (relay/ahead_lane.py), and the
-- settle pass that records ENQUEUED from the dispatch log off the hot path (engine/loops/dispatch_settler.py).
-- :now is NULL in production (the database's clock rules), a fixed instant in tests. Every write for a
-- shard is conditional on the lease (owner, epoch) the writer holds.

-- name: seal_lanes
-- Seals :lane of :node's :shards (at :epochs) up to :until: waits for open materializer transactions on
-- them (they hold the seal FOR SHARE), so once this commits every ahead row before the seal is visible.
-- The rows are locked in shard order first, the order the materializer takes them in: no deadlock.
-- Returns each sealed shard's seal (never moved back) and the instant.
WITH mine AS (
    SELECT s.shard
    FROM dispatch_seals s
    JOIN shard_leases l ON l.shard = s.shard
    JOIN unnest(:shards::int[], :epochs::bigint[]) AS held (shard, epoch) ON held.shard = s.shard
    WHERE s.lane = :lane AND l.epoch = held.epoch AND l.owner = :node
    ORDER BY s.shard
    FOR NO KEY UPDATE OF s
)
UPDATE dispatch_seals s
SET sealed_until = greatest(s.sealed_until, :until::timestamptz)
FROM mine
WHERE s.shard = mine.shard AND s.lane = :lane
RETURNING s.shard, s.sealed_until, coalesce(:now::timestamptz, now()) AS now;

-- name: cursor_positions
-- Where :lane of :shards stands: the key of the last acknowledged row.
SELECT shard, published_bucket, published_round, published_id
FROM dispatch_cursors
WHERE shard = ANY (:shards::int[]) AND lane = :lane;

-- name: read_ahead_page
-- The next rows of :lane, per shard: up to :per_shard rows after each shard's cursor (:buckets, :rounds,
-- :ids) and before its seal (:seals), ordered by shard then key (bucket, weighted round, occurrence_id),
-- with the identity headers' values already as bytes. Discarded rows are returned too (the cursor passes
-- them; the relay does not publish them). Only the columns the relay uses: every column is decoded per
-- row in the relay's one Python thread, and a window aggregate over the page cost the database as much as
-- the index scans. The instants come as integer microseconds since the Unix epoch (bucket_us,
-- available_us, late_after_us; exact): asyncpg builds a timezone-aware datetime per timestamptz in
-- Python-level code, and three of them per row were a fifth of a relay's busy time in a burst.
SELECT q.shard, (extract(epoch FROM q.bucket) * 1000000)::int8 AS bucket_us, q.wrr_round, q.occurrence_id,
       q.tenant_id, q.topic, q.message_key, q.message,
       (extract(epoch FROM q.available_at) * 1000000)::int8 AS available_us,
       q.discarded_at IS NOT NULL AS discarded,
       (extract(epoch FROM q.late_after) * 1000000)::int8 AS late_after_us,
       convert_to(q.occurrence_id::text, 'UTF8') AS occurrence_header,
       convert_to(q.tenant_id, 'UTF8') AS tenant_header
FROM unnest(:shards::int[], :buckets::timestamptz[], :rounds::int[], :ids::uuid[], :seals::timestamptz[])
     AS c (shard, bucket, wrr_round, occurrence_id, sealed_until)
CROSS JOIN LATERAL (
    SELECT *
    FROM dispatch_queue q
    WHERE q.shard = c.shard AND q.lane = :lane
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (c.bucket, c.wrr_round, c.occurrence_id)
      AND q.bucket < c.sealed_until
    ORDER BY q.bucket, q.wrr_round, q.occurrence_id
    LIMIT :per_shard
) q
ORDER BY q.shard, q.bucket, q.wrr_round, q.occurrence_id;

-- name: advance_cursors
-- After the broker acknowledged a page: moves :lane of :node's :shards (:epochs) to keys (:to_buckets,
-- :to_rounds, :to_ids), and logs the moves as ranges (:log_shards; from keys :log_from_*, to keys :log_to_*,
-- :log_rows rows each; consecutive per shard, the first from the shard's cursor) with each range's
-- acknowledgement instant :log_acked_ats (the occurrences' enqueued_at; NULL: :acked_at, the relay's
-- estimate of this database's clock when the broker's last acknowledgement of the page arrived, never
-- ahead of it; NULL: now). A shard whose epoch moved on (another owner) is left alone and nothing of it is
-- logged. Returns how many cursors moved and the page's instant.
WITH moved AS (
    UPDATE dispatch_cursors c
    SET published_bucket = m.to_bucket, published_round = m.to_round, published_id = m.to_id, epoch = m.epoch,
        updated_at = coalesce(:now::timestamptz, now())
    FROM shard_leases l,
         unnest(:shards::int[], :epochs::bigint[], :to_buckets::timestamptz[], :to_rounds::int[], :to_ids::uuid[])
         AS m (shard, epoch, to_bucket, to_round, to_id)
    WHERE c.shard = m.shard AND c.lane = :lane AND l.shard = m.shard AND l.epoch = m.epoch AND l.owner = :node
      AND (c.published_bucket, c.published_round, c.published_id) < (m.to_bucket, m.to_round, m.to_id)
    RETURNING m.shard, m.epoch
), logged AS (
    INSERT INTO dispatch_log (shard, lane, epoch, from_bucket, from_round, from_id, to_bucket, to_round, to_id,
                              rows, acked_at, logged_at)
    SELECT g.shard, :lane, mv.epoch, g.from_bucket, g.from_round, g.from_id, g.to_bucket, g.to_round, g.to_id,
           g.rows, coalesce(g.acked_at, :acked_at::timestamptz, :now::timestamptz, now()),
           coalesce(:now::timestamptz, now())
    FROM unnest(:log_shards::int[], :log_from_buckets::timestamptz[], :log_from_rounds::int[], :log_from_ids::uuid[],
                :log_to_buckets::timestamptz[], :log_to_rounds::int[], :log_to_ids::uuid[], :log_rows::int[],
                :log_acked_ats::timestamptz[])
         AS g (shard, from_bucket, from_round, from_id, to_bucket, to_round, to_id, rows, acked_at)
    JOIN moved mv ON mv.shard = g.shard
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS moved,
       coalesce(:acked_at::timestamptz, :now::timestamptz, now()) AS acked_at;

-- name: late_ahead_candidates
-- Lateness at dispatch: for the schedules (record keys :keys) of late rows a relay holds in :lane of
-- :shards, from each one's first such row (:buckets, :rounds, :ids) on, every due row still to be judged
-- (not discarded, late_after set), plus the held rows themselves whatever their state, locked so that
-- the verdict and the write happen together.
SELECT q.shard, q.bucket, q.wrr_round, q.occurrence_id, q.message_key, q.available_at, q.late_after,
       q.misfire_policy, q.discarded_at IS NOT NULL AS discarded
FROM unnest(:shards::int[], :keys::bytea[], :buckets::timestamptz[], :rounds::int[], :ids::uuid[])
     AS c (shard, message_key, bucket, wrr_round, occurrence_id)
JOIN dispatch_queue q ON q.shard = c.shard AND q.lane = :lane AND q.message_key = c.message_key
                     AND (q.bucket, q.wrr_round, q.occurrence_id) >= (c.bucket, c.wrr_round, c.occurrence_id)
                     AND q.bucket <= coalesce(:now::timestamptz, now())
WHERE q.available_at <= coalesce(:now::timestamptz, now())
  AND ((q.discarded_at IS NULL AND q.late_after IS NOT NULL) OR q.occurrence_id = ANY (:held_ids::uuid[]))
ORDER BY q.shard, q.bucket, q.wrr_round, q.occurrence_id
FOR UPDATE OF q;

-- name: judge_ahead_rows
-- Applies the verdict of lateness at dispatch in :lane, for the shards :node still holds at :epochs:
-- rows :missed_* are discarded (the cursor passes them) and their SCHEDULED occurrences recorded MISSED;
-- rows :kept_* are published although late (the policy allows them) and are never judged again.
WITH held AS (
    SELECT h.shard FROM unnest(:shards::int[], :epochs::bigint[]) AS h (shard, epoch)
    JOIN shard_leases l ON l.shard = h.shard AND l.epoch = h.epoch AND l.owner = :node
), missed AS (
    UPDATE dispatch_queue q SET discarded_at = coalesce(:now::timestamptz, now())
    FROM unnest(:missed_shards::int[], :missed_buckets::timestamptz[], :missed_rounds::int[], :missed_ids::uuid[])
         AS m (shard, bucket, wrr_round, occurrence_id)
    WHERE q.shard = m.shard AND q.lane = :lane AND q.bucket = m.bucket AND q.wrr_round = m.wrr_round
      AND q.occurrence_id = m.occurrence_id AND q.discarded_at IS NULL AND q.shard IN (SELECT shard FROM held)
    RETURNING q.occurrence_id
), kept AS (
    UPDATE dispatch_queue q SET late_after = NULL
    FROM unnest(:kept_shards::int[], :kept_buckets::timestamptz[], :kept_rounds::int[], :kept_ids::uuid[])
         AS k (shard, bucket, wrr_round, occurrence_id)
    WHERE q.shard = k.shard AND q.lane = :lane AND q.bucket = k.bucket AND q.wrr_round = k.wrr_round
      AND q.occurrence_id = k.occurrence_id AND q.shard IN (SELECT shard FROM held)
    RETURNING 1
), recorded AS (
    UPDATE occurrences o SET state = 'MISSED', updated_at = coalesce(:now::timestamptz, now())
    FROM missed
    WHERE o.occurrence_id = missed.occurrence_id AND o.state = 'SCHEDULED'
    RETURNING 1
)
SELECT coalesce((SELECT array_agg(occurrence_id) FROM missed), '{}') AS missed_ids,
       (SELECT count(*) FROM kept) AS kept, (SELECT count(*) FROM recorded) AS recorded;

-- name: quarantine_rows
-- Sets aside deliveries the broker refused for good after bounded tries (the cursor passes them).
INSERT INTO dispatch_quarantine (occurrence_id, shard, lane, tenant_id, topic, error, tries, quarantined_at)
SELECT q.*, coalesce(:now::timestamptz, now())
FROM unnest(:occurrence_ids::uuid[], :shards::int[], :lanes::text[], :tenant_ids::text[], :topics::text[],
            :errors::text[], :tries::int[]) AS q
ON CONFLICT (occurrence_id, topic) DO UPDATE SET error = excluded.error, tries = excluded.tries;

-- name: ahead_backlog
-- Ahead-lane rows due (available_at <= now) and not yet passed by their cursor, per lane. One index range
-- scan per (shard, lane) from its cursor: rows already sent but not yet settled are not read (a join over
-- the whole queue was a parallel sequential scan of every row, sent ones included, every few seconds on
-- every node while a burst was being dispatched).
-- The count inside the LATERAL keeps the planner from flattening it into a join over the whole queue.
SELECT c.lane, sum(q.due)::bigint AS due
FROM dispatch_cursors c
CROSS JOIN LATERAL (
    SELECT count(*) AS due
    FROM dispatch_queue q
    WHERE q.shard = c.shard AND q.lane = c.lane
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (c.published_bucket, c.published_round, c.published_id)
      AND q.bucket <= coalesce(:now::timestamptz, now())
      AND q.available_at <= coalesce(:now::timestamptz, now())
) q
GROUP BY c.lane;

-- name: settle_logged_pages
-- Off the hot path: takes up to :limit unsettled log entries (oldest first), records ENQUEUED and
-- enqueued_at (the acknowledgement instant) on their occurrences (SCHEDULED, or already started by a
-- consumer: then only enqueued_at), deletes their queue rows and
-- marks the entries settled. SKIP LOCKED: several settlers never wait for each other. With :gated, first asks
-- the deferral rule (chronoq_settle_waits, migrations 0021 and 0031, with :busy_here ... :max_defer_behind_s)
-- in this statement's snapshot and settles nothing while it says a burst is being dispatched or consumers are
-- working through one: a separate check ran seconds before its settle statement in a burst. Returns whether it
-- deferred, the entries and rows settled and each enqueued occurrence's schedule_lag (enqueued_at -
-- scheduled_for, seconds).
WITH gate AS (
    SELECT :gated::boolean
           AND chronoq_settle_waits(:busy_here, :busy_s, :busy_rows, :busy_entries, :max_defer_s,
                                    :max_defer_behind_s, coalesce(:now::timestamptz, now())) AS deferred
), entries AS (
    SELECT * FROM dispatch_log
    WHERE settled_at IS NULL AND NOT (SELECT deferred FROM gate)
    ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED
), published AS (
    DELETE FROM dispatch_queue q
    USING entries e
    WHERE q.shard = e.shard AND q.lane = e.lane
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (e.from_bucket, e.from_round, e.from_id)
      AND (q.bucket, q.wrr_round, q.occurrence_id) <= (e.to_bucket, e.to_round, e.to_id)
    RETURNING q.occurrence_id, q.scheduled_for, q.discarded_at, e.acked_at
), locked AS (
    -- In occurrence_id order, the attempt processor's lock order (lock_occurrences): a settle pass and a
    -- batch of attempt events on the same occurrences wait for each other, never deadlock (they did in the
    -- 500,000 hour-top with consumers: the pass failed and was retried twice).
    -- The queue row's scheduled_for is its occurrence's (the ahead lane holds first deliveries only): each
    -- probe reads one day partition's key (migration 0016), not every day's.
    SELECT o.occurrence_id, o.scheduled_for, p.acked_at
    FROM occurrences o
    JOIN published p ON o.occurrence_id = p.occurrence_id AND o.scheduled_for = p.scheduled_for
    WHERE p.discarded_at IS NULL
    ORDER BY o.occurrence_id
    FOR UPDATE OF o
), enqueued AS (
    -- The log's instant is the broker's acknowledgement and wins over one the attempt processor wrote when a
    -- consumer's `started` came before this pass (that is when it applied the event: up to the whole burst's
    -- deferral late).
    UPDATE occurrences o
    SET state = CASE WHEN o.state = 'SCHEDULED' THEN 'ENQUEUED' ELSE o.state END,
        enqueued_at = l.acked_at,
        updated_at = coalesce(:now::timestamptz, now())
    FROM locked l
    WHERE o.occurrence_id = l.occurrence_id AND o.scheduled_for = l.scheduled_for
      AND (o.state = 'SCHEDULED' OR o.enqueued_at IS DISTINCT FROM l.acked_at)
    RETURNING extract(epoch FROM o.enqueued_at - o.scheduled_for)::float8 AS lag
), settled AS (
    UPDATE dispatch_log l SET settled_at = coalesce(:now::timestamptz, now())
    FROM entries e WHERE l.id = e.id
    RETURNING 1
)
SELECT (SELECT deferred FROM gate) AS deferred, (SELECT count(*) FROM settled) AS entries,
       (SELECT count(*) FROM published) AS rows, coalesce((SELECT array_agg(lag) FROM enqueued), '{}') AS lags;

-- name: settle_deferred
-- Whether the settle pass should wait because a burst is still being dispatched or consumers are working
-- through one (the rule: chronoq_settle_waits, migrations 0021 and 0031; settle_logged_pages asks it too, in
-- its own snapshot).
SELECT chronoq_settle_waits(:busy_here, :busy_s, :busy_rows, :busy_entries, :max_defer_s, :max_defer_behind_s,
                            coalesce(:now::timestamptz, now())) AS defer;

-- name: announce_handover
-- :node's relay is handing a burst over: other nodes' settle passes wait until :until_s seconds from now
-- (settle_deferred). A node not registered yet (no heartbeat) changes nothing.
UPDATE engine_nodes SET handing_over_until = coalesce(:now::timestamptz, now()) + make_interval(secs => :until_s)
WHERE node_id = :node;

-- name: prune_settled_log
-- Forgets up to :limit log entries settled more than :keep_s seconds ago, oldest first (through
-- dispatch_log_settled: it reads only what it deletes; SKIP LOCKED: two nodes' prunes never wait for each
-- other). Unsettled entries are never touched. Returns how many went.
WITH gone AS (
    DELETE FROM dispatch_log
    WHERE id IN (
        SELECT id FROM dispatch_log
        WHERE settled_at < coalesce(:now::timestamptz, now()) - make_interval(secs => :keep_s)
        ORDER BY settled_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone;

-- name: ahead_enqueued_at
-- For the occurrences :occurrence_ids (of schedules :schedule_ids, available at :available_ats, pairwise)
-- still in the ahead lane: the acknowledgement instant of the page that published them, if one did (the
-- settle pass has not recorded it yet; it skips discarded rows, so does this). The caller has read the
-- occurrences: nothing here probes them (by id alone that is every day partition's key).
SELECT q.occurrence_id, l.acked_at
FROM unnest(:occurrence_ids::uuid[], :schedule_ids::uuid[], :available_ats::timestamptz[])
     AS o (occurrence_id, schedule_id, available_at)
JOIN schedules s ON s.schedule_id = o.schedule_id
JOIN dispatch_queue q ON q.shard = s.shard AND q.lane IN ('strict', 'flexible')
                     AND q.bucket = date_trunc('second', o.available_at, 'UTC') AND q.occurrence_id = o.occurrence_id
                     AND q.discarded_at IS NULL
JOIN LATERAL (
    SELECT acked_at
    FROM dispatch_log l
    WHERE l.shard = q.shard AND l.lane = q.lane AND l.to_bucket >= q.bucket
      AND (q.bucket, q.wrr_round, q.occurrence_id) > (l.from_bucket, l.from_round, l.from_id)
      AND (q.bucket, q.wrr_round, q.occurrence_id) <= (l.to_bucket, l.to_round, l.to_id)
    ORDER BY l.id
    LIMIT 1
) l ON true;
