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
-- (excluding schedule :exclude_schedule_id, the one being updated, if given).
SELECT count(*) AS schedules, coalesce(sum(fires_per_minute), 0)::double precision AS fires_per_minute
FROM schedules
WHERE tenant_id = :tenant_id AND state IN ('active', 'paused')
  AND (:exclude_schedule_id::uuid IS NULL OR schedule_id <> :exclude_schedule_id::uuid);
