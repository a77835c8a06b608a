-- Tenants: identity, credentials and what counts against their quotas.

-- name: insert_tenant
-- Creates a tenant with its quotas; returns nothing when the name is taken.
INSERT INTO tenants (tenant_id, api_token_hash, signing_key, max_active_schedules, max_fires_per_minute,
                     max_payload_bytes, max_running, catch_up_per_minute, retry_budget_per_hour, weight)
VALUES (:tenant_id, :api_token_hash, :signing_key, :max_active_schedules, :max_fires_per_minute,
        :max_payload_bytes, :max_running, :catch_up_per_minute, :retry_budget_per_hour, :weight)
ON CONFLICT (tenant_id) DO NOTHING
RETURNING *;

-- name: get_tenant
-- One tenant by id.
SELECT * FROM tenants WHERE tenant_id = :tenant_id;

-- name: tenant_by_token_hash
-- The active tenant a bearer token belongs to.
SELECT * FROM tenants WHERE api_token_hash = :api_token_hash AND state = 'active';

-- name: lock_tenant
-- Locks the tenant row: quota checks and the insert they guard are serialized per tenant.
SELECT * FROM tenants WHERE tenant_id = :tenant_id FOR UPDATE;

-- name: tenant_usage
-- What counts against a tenant's quotas: its live (active or paused) schedules and their trigger rate
-- (excluding schedule :exclude_schedule_id, the one being updated, if given), and its open occurrences
-- (against max_running; migration 0027). The tenant's counter, after
-- folding into it the changes logged since its last fold (migration 0024), and how many it folded: costs
-- the changes, not the schedules. Run it holding the tenant's row lock (lock_tenant), which serializes one
-- tenant's folds.
WITH folded AS (
    DELETE FROM tenant_usage_changes WHERE tenant_id = :tenant_id RETURNING schedules, fires_per_minute, open_occurrences
), counter AS (
    INSERT INTO tenant_usage AS u (tenant_id, schedules, fires_per_minute, open_occurrences)
    SELECT :tenant_id, coalesce(sum(f.schedules), 0), coalesce(sum(f.fires_per_minute), 0),
           coalesce(sum(f.open_occurrences), 0)
    FROM folded f
    ON CONFLICT (tenant_id) DO UPDATE
    SET schedules = u.schedules + excluded.schedules, fires_per_minute = u.fires_per_minute + excluded.fires_per_minute,
        open_occurrences = u.open_occurrences + excluded.open_occurrences
    RETURNING u.schedules, u.fires_per_minute, u.open_occurrences
), excluded_schedule AS (
    SELECT count(*) AS schedules, coalesce(sum(s.fires_per_minute::numeric), 0) AS fires_per_minute
    FROM schedules s
    WHERE s.schedule_id = :exclude_schedule_id::uuid AND s.tenant_id = :tenant_id AND s.state IN ('active', 'paused')
)
SELECT c.schedules - x.schedules AS schedules, (c.fires_per_minute - x.fires_per_minute)::double precision AS fires_per_minute,
       c.open_occurrences, (SELECT count(*) FROM folded) AS folded
FROM counter c CROSS JOIN excluded_schedule x;

-- name: tenants_with_usage_changes
-- Tenants with changes logged since their last fold, the longest logs first, at most :limit of them (the
-- periodic fold, engine/loops/tenant_usage_folds.py: a tenant that never creates again still gets its
-- completions and cancels folded, so the log and every read that sums it stay short).
-- Only tenants that exist: a fold locks the tenant's row (tenants are never deleted; a schedule needs one).
SELECT c.tenant_id, count(*) AS changes
FROM tenant_usage_changes c
JOIN tenants t ON t.tenant_id = c.tenant_id
GROUP BY c.tenant_id
ORDER BY count(*) DESC, c.tenant_id
LIMIT :limit;

-- name: lock_tenant_unless_busy
-- Locks the tenant row unless another transaction holds it (a create or update folds the log itself); no
-- row: busy, or no such tenant.
SELECT tenant_id FROM tenants WHERE tenant_id = :tenant_id FOR UPDATE SKIP LOCKED;

-- name: read_tenants_usage
-- Tenants with their quotas and usage as the next fold would find it, read only: each one's counter plus
-- the changes logged since its last fold. Tenant :tenant_id (NULL: every tenant), the ones nearest a quota
-- first (the larger of their shares of max_active_schedules and max_fires_per_minute: either refuses the
-- next create; the console shows the same share, TenantUsage.nearest_share), at most :limit of them (NULL:
-- all). One statement, one snapshot: it sees a fold entirely or not at all, so nothing is counted twice or
-- missed; no lock, so a reader never waits for a create of the tenant.
SELECT t.*, n.schedules, n.fires_per_minute, n.open_occurrences
FROM tenants t
LEFT JOIN tenant_usage u ON u.tenant_id = t.tenant_id
CROSS JOIN LATERAL (SELECT sum(l.schedules) AS schedules, sum(l.fires_per_minute) AS fires_per_minute,
                           sum(l.open_occurrences) AS open_occurrences
                    FROM tenant_usage_changes l WHERE l.tenant_id = t.tenant_id) c
CROSS JOIN LATERAL (SELECT (coalesce(u.schedules, 0) + coalesce(c.schedules, 0))::bigint AS schedules,
                           (coalesce(u.fires_per_minute, 0) + coalesce(c.fires_per_minute, 0))::double precision
                               AS fires_per_minute,
                           (coalesce(u.open_occurrences, 0) + coalesce(c.open_occurrences, 0))::bigint
                               AS open_occurrences) n
WHERE :tenant_id::text IS NULL OR t.tenant_id = :tenant_id
ORDER BY greatest(n.schedules::float8 / greatest(t.max_active_schedules, 1),
                  n.fires_per_minute / greatest(t.max_fires_per_minute, 1e-9)) DESC,
         t.tenant_id
LIMIT :limit;

-- name: recount_tenant_usage
-- Sets the tenant's counter to a count of its live schedules, their rate sum and its open occurrences,
-- dropping the changes logged before this statement's snapshot (the counts include them; changes committed
-- later stay to be folded). Run it holding the tenant's row lock. Costs a scan of the tenant's hot
-- occurrences (an operator's repair, never a hot path).
WITH dropped AS (
    DELETE FROM tenant_usage_changes WHERE tenant_id = :tenant_id
), counted AS (
    SELECT count(*) AS schedules, coalesce(sum(fires_per_minute::numeric), 0) AS fires_per_minute
    FROM schedules
    WHERE tenant_id = :tenant_id AND state IN ('active', 'paused')
), open AS (
    SELECT count(*) AS open_occurrences
    FROM occurrences
    WHERE tenant_id = :tenant_id AND state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
)
INSERT INTO tenant_usage AS u (tenant_id, schedules, fires_per_minute, open_occurrences)
SELECT :tenant_id, c.schedules, c.fires_per_minute, o.open_occurrences FROM counted c CROSS JOIN open o
ON CONFLICT (tenant_id) DO UPDATE
SET schedules = excluded.schedules, fires_per_minute = excluded.fires_per_minute,
    open_occurrences = excluded.open_occurrences
RETURNING u.schedules, u.fires_per_minute::double precision AS fires_per_minute, u.open_occurrences;

-- name: open_count_drift
-- Tenants whose open-occurrence counter (chronoq_open_occurrences: counter plus unfolded changes) differs
-- from a count of their open hot occurrences, with both numbers; none when all agree. One statement, one
-- snapshot. A check for tests and the chaos run (it counts every open occurrence: not for a hot path).
WITH counted AS (
    SELECT tenant_id, count(*) AS n
    FROM occurrences
    WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
    GROUP BY tenant_id
), seen AS (
    SELECT tenant_id FROM counted
    UNION SELECT tenant_id FROM tenant_usage
    UNION SELECT tenant_id FROM tenant_usage_changes
), compared AS (
    SELECT s.tenant_id, chronoq_open_occurrences(s.tenant_id) AS counter, coalesce(c.n, 0) AS counted
    FROM seen s LEFT JOIN counted c ON c.tenant_id = s.tenant_id
)
SELECT tenant_id, counter, counted FROM compared WHERE counter <> counted ORDER BY tenant_id;
