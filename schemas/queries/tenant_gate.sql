-- The tenant gate: a tenant's max_running bounds its admitted occurrences. The materializer writes first
-- deliveries beyond it to the outbox held (claimed with :token until 'infinity', which no relay takes); the
-- gate lets them go, earliest due first, as the tenant's occurrences finish. Held, never dropped.
-- Admitted = open (SCHEDULED, ENQUEUED, RUNNING, RETRY_WAIT) and not held by this gate: RUNNING is learned
-- from events, later, so a delivery counts from the moment the relay may publish it. A tenant's open
-- occurrences are its counter plus its unfolded changes (chronoq_open_occurrences, migration 0027), read in one
-- statement: the cost of the changes since the last fold, not of the open set (counting that on every
-- pass was ~5 µs per occurrence of a large tenant's burst).

-- name: tenant_room
-- For the tenants :tenant_ids about to get new first deliveries: how many more may be admitted now. A tenant
-- with deliveries already held gets none (they go first: held rows leave in due order).
SELECT t.tenant_id,
       CASE WHEN h.held > 0 THEN 0 ELSE greatest(t.max_running - chronoq_open_occurrences(t.tenant_id), 0) END AS room
FROM tenants t
CROSS JOIN LATERAL (
    SELECT count(*) AS held FROM (
        SELECT 1 FROM outbox o
        WHERE o.tenant_id = t.tenant_id AND o.claim_token = :token AND o.claim_expires_at = 'infinity'
          AND o.sent_at IS NULL AND o.discarded_at IS NULL
        LIMIT 1
    ) any_held
) h
WHERE t.tenant_id = ANY (:tenant_ids::text[]);

-- name: lock_tenant_gate
-- Serialises the gate's passes (held to the end of the transaction): two gates never both fill the same room.
SELECT pg_advisory_xact_lock(hashtext('chronoq.tenant_gate'));

-- name: release_tenant_deliveries
-- One pass of the gate (after lock_tenant_gate, in the same transaction): for every
-- tenant with held deliveries, lets go of as many as fit under max_running (open minus held), the earliest
-- due first; the late-lane relay publishes them at their available_at (late by the wait: schedule_lag shows
-- it). Returns per tenant what was released and what still waits.
WITH held AS (
    SELECT o.tenant_id, count(*) AS held
    FROM outbox o
    WHERE o.claim_token = :token AND o.claim_expires_at = 'infinity' AND o.sent_at IS NULL AND o.discarded_at IS NULL
    GROUP BY o.tenant_id
), room AS (
    SELECT h.tenant_id, h.held,
           t.max_running - (chronoq_open_occurrences(h.tenant_id) - h.held) AS room
    FROM held h
    JOIN tenants t ON t.tenant_id = h.tenant_id
), chosen AS (
    SELECT o.id
    FROM room r
    CROSS JOIN LATERAL (
        SELECT o.id
        FROM outbox o
        WHERE o.tenant_id = r.tenant_id AND o.claim_token = :token AND o.claim_expires_at = 'infinity'
          AND o.sent_at IS NULL AND o.discarded_at IS NULL
        ORDER BY o.available_at, o.id
        LIMIT greatest(r.room, 0)
        FOR UPDATE SKIP LOCKED
    ) o
), released AS (
    UPDATE outbox o
    SET claim_token = NULL, claim_expires_at = NULL
    FROM chosen c
    WHERE o.id = c.id
    RETURNING o.tenant_id
)
SELECT r.tenant_id, r.held AS held_before,
       (SELECT count(*) FROM released x WHERE x.tenant_id = r.tenant_id) AS released
FROM room r;
