-- Runtime queries of the consumer runtime, run against the consumer app's OWN database.

-- name: insert_dedupe
-- Records that this consumer group applies an occurrence, in the transaction of the effect.
-- Returns a row only for the first application; a redelivery (or a concurrent twin, which waits for
-- the first transaction) gets nothing back and must not apply the effect.
INSERT INTO chronoq_consumer_dedupe (consumer_group, occurrence_id, schedule_id, schedule_version, tenant_id,
                                     scheduled_for)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
RETURNING applied_at;

-- name: dedupe_exists
-- Whether this group already applied the occurrence.
SELECT EXISTS (SELECT 1 FROM chronoq_consumer_dedupe WHERE consumer_group = $1 AND occurrence_id = $2);
