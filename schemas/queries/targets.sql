-- The target registry: which tenants may schedule onto a target (engine/control/targets.py).

-- name: claim_target
-- Registers an unregistered target to :tenant_id (first use claims it); returns nothing if it was
-- registered already. A concurrent claim of the same name waits for the first, then returns nothing.
INSERT INTO targets (target, owner_tenant, created_at, updated_at)
VALUES (:target, :tenant_id, coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()))
ON CONFLICT (target) DO NOTHING
RETURNING *;

-- name: target_access
-- Whether :tenant_id may use :target (owner or granted); no row when the target is unregistered.
SELECT t.owner_tenant = :tenant_id AS owner,
       EXISTS (SELECT 1 FROM target_grants g WHERE g.target = t.target AND g.tenant_id = :tenant_id) AS granted
FROM targets t WHERE t.target = :target;

-- name: lock_target
-- Locks a target's row: changes of its tenants are serialized (and versioned) per target.
SELECT * FROM targets WHERE target = :target FOR UPDATE;

-- name: insert_target_grant
-- Grants :target to :tenant_id; returns nothing if it was granted already.
INSERT INTO target_grants (target, tenant_id, granted_at)
VALUES (:target, :tenant_id, coalesce(:now::timestamptz, now()))
ON CONFLICT (target, tenant_id) DO NOTHING
RETURNING tenant_id;

-- name: delete_target_grant
-- Revokes a grant; returns nothing if there was none.
DELETE FROM target_grants WHERE target = :target AND tenant_id = :tenant_id RETURNING tenant_id;

-- name: bump_target_version
-- A change of the target's tenants: the next version of its binding.
UPDATE targets SET version = version + 1, updated_at = coalesce(:now::timestamptz, now())
WHERE target = :target
RETURNING *;

-- name: target_tenants
-- The tenants bound to :target: the owner first, then the granted tenants by name.
SELECT tenant_id FROM (
    SELECT owner_tenant AS tenant_id, 0 AS rank FROM targets WHERE target = :target
    UNION ALL
    SELECT tenant_id, 1 FROM target_grants WHERE target = :target
) bound
ORDER BY rank, tenant_id;

-- name: live_schedules_on_target
-- How many live (active or paused) schedules :tenant_id has on :target.
SELECT count(*) FROM schedules WHERE target = :target AND tenant_id = :tenant_id AND state IN ('active', 'paused');

-- name: list_targets
-- Every target with its owner and granted tenants (only those :tenant_id may use, if given), by name.
SELECT t.target, t.owner_tenant, t.version,
       coalesce(array_agg(g.tenant_id ORDER BY g.tenant_id) FILTER (WHERE g.tenant_id IS NOT NULL), '{}')
           AS granted
FROM targets t LEFT JOIN target_grants g ON g.target = t.target
WHERE :tenant_id::text IS NULL OR t.owner_tenant = :tenant_id::text
   OR EXISTS (SELECT 1 FROM target_grants x WHERE x.target = t.target AND x.tenant_id = :tenant_id::text)
GROUP BY t.target
ORDER BY t.target;

-- name: binding_versions
-- The binding version of each registered target among :targets. An occurrence message carries its target's
-- (read in the transaction that writes the message: that version's binding message committed before it).
SELECT target, version FROM targets WHERE target = ANY(:targets::text[]);
