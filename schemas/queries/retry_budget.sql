-- The tenants' retry budgets: retries spent per clock hour (UTC).

-- name: spend_retry_budget
-- Spends one retry of a tenant's budget (:per_hour per clock hour, UTC); returns a row only if one was left.
-- One conditional upsert: concurrent failures cannot overspend.
INSERT INTO tenant_retry_usage AS u (tenant_id, window_start, retries)
SELECT :tenant_id, date_trunc('hour', coalesce(:now::timestamptz, now()), 'UTC'), 1
WHERE :per_hour > 0
ON CONFLICT (tenant_id, window_start) DO UPDATE SET retries = u.retries + 1 WHERE u.retries < :per_hour
RETURNING retries;

-- name: prune_retry_usage
-- Forgets retry-budget windows older than the previous hour.
DELETE FROM tenant_retry_usage
WHERE window_start < date_trunc('hour', coalesce(:now::timestamptz, now()), 'UTC') - interval '1 hour';
