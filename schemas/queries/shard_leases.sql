-- Shard leases of engine nodes: heartbeats, acquire, renew, release (engine/loops/shard_leases.py), and the
-- lock a shard owner's materializer takes. Every expiry instant is the database's clock (:now is NULL in
-- production, a fixed instant in tests). Writes for a shard are conditional on (owner, epoch).

-- name: heartbeat_node
-- Records that :node is alive until now + :ttl_s seconds (the first heartbeat registers it).
INSERT INTO engine_nodes AS n (node_id, started_at, heartbeat_at, expires_at)
VALUES (:node, coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()),
        coalesce(:now::timestamptz, now()) + make_interval(secs => :ttl_s))
ON CONFLICT (node_id) DO UPDATE
SET heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at
RETURNING heartbeat_at;

-- name: live_nodes
-- Nodes whose heartbeat has not expired.
SELECT node_id FROM engine_nodes WHERE expires_at > coalesce(:now::timestamptz, now()) ORDER BY node_id;

-- name: lease_picture
-- Every shard's owner and whether its lease has expired: what the rebalance planner reads.
SELECT shard, owner, epoch, expires_at <= coalesce(:now::timestamptz, now()) AS expired
FROM shard_leases
ORDER BY shard;

-- name: acquire_shards
-- Takes those of :shards that are free (never owned, released, or expired) for :node until now + :ttl_s,
-- bumping each one's epoch (which fences the previous owner). SKIP LOCKED: a shard whose previous owner
-- still has a materializer transaction open (FOR SHARE) is left for a later round, never waited for.
WITH free AS (
    SELECT shard
    FROM shard_leases
    WHERE shard = ANY (:shards::int[]) AND (owner IS NULL OR expires_at <= coalesce(:now::timestamptz, now()))
    FOR UPDATE SKIP LOCKED
)
UPDATE shard_leases l
SET owner = :node, epoch = l.epoch + 1,
    expires_at = coalesce(:now::timestamptz, now()) + make_interval(secs => :ttl_s),
    acquired_at = coalesce(:now::timestamptz, now())
FROM free
WHERE l.shard = free.shard
RETURNING l.shard, l.epoch;

-- name: renew_shards
-- Extends :node's leases of :shards at :epochs to now + :ttl_s; returns the ones still held (a shard
-- another node has taken since keeps its new owner and is missing from the result).
UPDATE shard_leases l
SET expires_at = coalesce(:now::timestamptz, now()) + make_interval(secs => :ttl_s)
FROM unnest(:shards::int[], :epochs::bigint[]) AS mine (shard, epoch)
WHERE l.shard = mine.shard AND l.epoch = mine.epoch AND l.owner = :node
RETURNING l.shard, l.epoch;

-- name: release_shards
-- Gives up :node's leases of :shards at :epochs (its relay stopped publishing them first).
UPDATE shard_leases l
SET owner = NULL, expires_at = coalesce(:now::timestamptz, now())
FROM unnest(:shards::int[], :epochs::bigint[]) AS mine (shard, epoch)
WHERE l.shard = mine.shard AND l.epoch = mine.epoch AND l.owner = :node
RETURNING l.shard;

-- name: remove_node
-- A node that stops cleanly leaves the live list at once (its shards were released before).
DELETE FROM engine_nodes WHERE node_id = :node;

-- name: lock_shards_for_materializing
-- In the materializer's transaction: of :shards at :epochs, those :node still holds (unexpired), with each
-- lane's seal locked FOR SHARE: a relay's seal UPDATE waits until this transaction ends, so rows it writes
-- at or after the seal are committed before any relay (this node's, or a new owner's) reads past it. The
-- lease row is only read, not locked: renewals and acquisitions never wait for a materializer, and a stale
-- owner's rows are harmless anyway (deterministic ids, unique occurrences, the compare-and-set advance, and
-- the seal lock above make whoever owns the shard publish them).
SELECT l.shard, l.epoch, s.lane, s.sealed_until
FROM shard_leases l
JOIN unnest(:shards::int[], :epochs::bigint[]) AS mine (shard, epoch) ON mine.shard = l.shard AND mine.epoch = l.epoch
JOIN dispatch_seals s ON s.shard = l.shard
WHERE l.owner = :node AND l.expires_at > coalesce(:now::timestamptz, now())
ORDER BY l.shard, s.lane
FOR SHARE OF s;
