-- Queries of `chronoq status`: what the engine is doing, read-only and bounded.
-- :now is the instant to judge by (the run's current_instant).

-- name: engine_node_ages
-- Every engine node that registered (shard leases, migration 0008): seconds since its heartbeat and until
-- its registration expires (negative: past).
SELECT node_id,
       extract(epoch FROM :now::timestamptz - heartbeat_at)::float8 AS heartbeat_age_s,
       extract(epoch FROM expires_at - :now::timestamptz)::float8 AS expires_in_s
FROM engine_nodes
ORDER BY node_id;

-- name: shard_lease_owners
-- Shard leases per owner (NULL: never owned or released): how many, how many expired, the soonest expiry
-- in seconds from :now and the highest epoch. An unowned lease's expiry may be -infinity: not measured.
SELECT owner,
       count(*)::int AS shards,
       count(*) FILTER (WHERE expires_at <= :now::timestamptz)::int AS expired,
       min(extract(epoch FROM expires_at - :now::timestamptz)::float8) FILTER (WHERE isfinite(expires_at))
           AS soonest_expiry_in_s,
       max(epoch) AS max_epoch
FROM shard_leases
GROUP BY owner
ORDER BY owner NULLS LAST;

-- name: materialization_backlog
-- Active schedules whose cursor is due, by how long it has been due, plus those due within :horizon_s seconds
-- (the materializer's horizon) and the oldest due cursor. Cohort members count with their cohort's cursor.
SELECT count(*) FILTER (WHERE next_run_at <= :now::timestamptz - interval '1 hour') AS over_1h,
       count(*) FILTER (WHERE next_run_at > :now::timestamptz - interval '1 hour'
                          AND next_run_at <= :now::timestamptz - interval '5 minutes') AS from_5m_to_1h,
       count(*) FILTER (WHERE next_run_at > :now::timestamptz - interval '5 minutes'
                          AND next_run_at <= :now::timestamptz - interval '1 minute') AS from_1m_to_5m,
       count(*) FILTER (WHERE next_run_at > :now::timestamptz - interval '1 minute'
                          AND next_run_at <= :now::timestamptz) AS under_1m,
       count(*) FILTER (WHERE next_run_at > :now::timestamptz) AS within_horizon,
       min(next_run_at) AS oldest_cursor
FROM (
    SELECT next_run_at FROM schedules
    WHERE state = 'active' AND cohort_id IS NULL
      AND next_run_at <= :now::timestamptz + make_interval(secs => :horizon_s)
    UNION ALL
    SELECT c.next_run_at FROM schedule_cohorts c JOIN schedules s ON s.cohort_id = c.cohort_id
    WHERE s.state = 'active' AND c.next_run_at <= :now::timestamptz + make_interval(secs => :horizon_s)
) cursors;

-- name: schedule_counts
-- Schedules per state.
SELECT state, count(*) AS schedules FROM schedules GROUP BY state;

-- name: outbox_backlog_buckets
-- Unsent outbox rows that are due, by how long they have been due; those claimed by a relay right now
-- and those held by the overlap gate; the oldest due instant.
SELECT count(*) FILTER (WHERE available_at <= :now::timestamptz) AS due,
       count(*) FILTER (WHERE available_at <= :now::timestamptz - interval '1 minute') AS due_over_1m,
       count(*) FILTER (WHERE available_at <= :now::timestamptz - interval '5 seconds') AS due_over_5s,
       count(*) FILTER (WHERE claim_expires_at > :now::timestamptz AND claim_expires_at <> 'infinity') AS claimed,
       count(*) FILTER (WHERE claim_expires_at = 'infinity') AS held_by_overlap_gate,
       min(available_at) FILTER (WHERE available_at <= :now::timestamptz) AS oldest_due
FROM outbox
WHERE sent_at IS NULL AND discarded_at IS NULL;

-- name: relay_rates
-- Rows the relays marked sent in the last 10 s, 60 s and 5 min, among the :recent newest outbox rows
-- (bounded work: a row sent long after it was written is not counted).
SELECT count(*) FILTER (WHERE sent_at > :now::timestamptz - interval '10 seconds') AS sent_10s,
       count(*) FILTER (WHERE sent_at > :now::timestamptz - interval '60 seconds') AS sent_60s,
       count(*) FILTER (WHERE sent_at > :now::timestamptz - interval '5 minutes') AS sent_5m,
       max(sent_at) AS last_sent
FROM (SELECT sent_at FROM outbox ORDER BY id DESC LIMIT :recent) recent;

-- name: in_flight
-- Occurrences in flight: running (and how many of those are past their lease), waiting to retry,
-- dead (the dead-letter list), and those the stuck-occurrence pass is watching or has flagged.
SELECT (SELECT count(*) FROM occurrences WHERE state = 'RUNNING') AS running,
       (SELECT count(*) FROM occurrences WHERE state = 'RUNNING' AND lease_expires_at < :now::timestamptz)
           AS running_past_lease,
       (SELECT min(lease_expires_at) FROM occurrences WHERE state = 'RUNNING') AS oldest_lease_expiry,
       (SELECT count(*) FROM occurrences WHERE state = 'DEAD') AS dead,
       (SELECT count(*) FROM occurrences WHERE state = 'ENQUEUED') AS enqueued,
       (SELECT min(updated_at) FROM occurrences WHERE state = 'ENQUEUED') AS oldest_enqueued,
       (SELECT count(*) FROM stuck_occurrences WHERE resolved_at IS NULL AND flagged_at IS NULL) AS stuck_watched,
       (SELECT count(*) FROM stuck_occurrences WHERE resolved_at IS NULL AND flagged_at IS NOT NULL) AS stuck_flagged;

-- name: last_reconcile
-- The latest reconcile run.
SELECT run_id, started_at, finished_at, window_from, window_to, tenant_id, clean, counts, duration_s
FROM reconcile_runs ORDER BY run_id DESC LIMIT 1;
