-- The set-based materializer (engine/loops/materializer.py): due schedules become occurrences and their
-- deliveries, and their cursors advance, in one statement per batch. Every time-sensitive query takes
-- :now: NULL in production (the database's clock rules), a fixed instant in tests.

-- name: create_staging
-- The per-connection staging table the materializer COPYs a batch into (emptied at every commit). Instants
-- are int8 microseconds since the Unix epoch (*_us): asyncpg encodes an int8 in a tenth of a timestamptz's
-- time, and a row has four; materialize_staged turns them back with
-- timestamptz 'epoch' + us * interval '1 microsecond' (exact: the product is computed as float8, which holds
-- every microsecond count below 2^53, the year 2255; a pass stages instants within its horizon of now).
CREATE TEMP TABLE IF NOT EXISTS materialize_staging (
    occurrence_id uuid, schedule_id uuid, schedule_version integer, tenant_id text, target text,
    scheduled_us int8, available_us int8, state text, topic text, message_key bytea,
    message bytea, held boolean, ahead boolean, shard integer, lane text, bucket_us int8, wrr_round integer,
    late_after_us int8, misfire_policy text, tenant_held boolean, cohort_id uuid
) ON COMMIT DELETE ROWS;

-- name: due_schedules_of_shards
-- Up to :per_shard active schedules per shard of :shards whose cursor falls within the horizon (:horizon_s
-- seconds past now), oldest cursor first within each shard (one index range scan of schedules_due per shard, in one
-- statement), with the tenant's weight and the payload as JSON text (spliced into the message as is).
-- No row lock: the advance below is a compare-and-set on (version, next_run_at), and the shard lease
-- keeps other nodes' materializers away.
SELECT s.schedule_id, s.tenant_id, s.kind, s.expression, s.time_zone, s.dst_repeat, s.dst_gap, s.anchor,
       s.start_at, s.end_at, s.version, s.next_run_at, s.target, s.payload::text AS payload_json, s.priority,
       s.flexible_window_s, s.misfire_policy, s.max_lateness_s, s.deadline_s, s.overlap_policy, s.calendar_id,
       s.max_runs, s.runs, s.shard, coalesce(t.weight, 1) AS weight, NULL::uuid AS cohort_id,
       NULL::bigint AS cohort_version
FROM unnest(:shards::int[]) AS sh (shard)
CROSS JOIN LATERAL (
    SELECT *
    FROM schedules s
    WHERE s.shard = sh.shard AND s.state = 'active' AND s.cohort_id IS NULL
      AND s.next_run_at <= coalesce(:now::timestamptz, now()) + make_interval(secs => :horizon_s)
    ORDER BY s.next_run_at
    LIMIT :per_shard
) s
LEFT JOIN tenants t ON t.tenant_id = s.tenant_id;

-- name: due_schedules_any_shard
-- Up to :limit due schedules of any shard, oldest cursor first (a node without shard leases: tests, tools).
-- Schedules in a cohort are read with it (due_cohorts_*, lock_due_cohorts, cohort_members): their own
-- cursor is frozen.
SELECT s.schedule_id, s.tenant_id, s.kind, s.expression, s.time_zone, s.dst_repeat, s.dst_gap, s.anchor,
       s.start_at, s.end_at, s.version, s.next_run_at, s.target, s.payload::text AS payload_json, s.priority,
       s.flexible_window_s, s.misfire_policy, s.max_lateness_s, s.deadline_s, s.overlap_policy, s.calendar_id,
       s.max_runs, s.runs, s.shard, coalesce(t.weight, 1) AS weight, NULL::uuid AS cohort_id,
       NULL::bigint AS cohort_version
FROM schedules s
LEFT JOIN tenants t ON t.tenant_id = s.tenant_id
WHERE s.state = 'active' AND s.cohort_id IS NULL
  AND s.next_run_at <= coalesce(:now::timestamptz, now()) + make_interval(secs => :horizon_s)
ORDER BY s.next_run_at
LIMIT :limit;

-- name: due_cohorts_of_shards
-- Due cohorts per shard of :shards (cursor within the horizon, oldest first), whole, up to about :per_shard
-- members per shard (at least one cohort; counted by their members column). No lock: lock_due_cohorts next.
SELECT d.cohort_id
FROM unnest(:shards::int[]) AS sh (shard)
CROSS JOIN LATERAL (
    SELECT f.cohort_id, f.members, sum(f.members) OVER (ORDER BY f.next_run_at, f.cohort_id) AS upto
    FROM (
        SELECT c.cohort_id, c.next_run_at, c.members
        FROM schedule_cohorts c
        WHERE c.shard = sh.shard
          AND c.next_run_at <= coalesce(:now::timestamptz, now()) + make_interval(secs => :horizon_s)
        ORDER BY c.next_run_at, c.cohort_id
        LIMIT :per_shard
    ) f
) d
WHERE d.upto - d.members < :per_shard;

-- name: due_cohorts_any_shard
-- Due cohorts of any shard, oldest cursor first, whole, up to about :limit members (at least one cohort).
SELECT d.cohort_id
FROM (
    SELECT f.cohort_id, f.members, sum(f.members) OVER (ORDER BY f.next_run_at, f.cohort_id) AS upto
    FROM (
        SELECT c.cohort_id, c.next_run_at, c.members
        FROM schedule_cohorts c
        WHERE c.next_run_at <= coalesce(:now::timestamptz, now()) + make_interval(secs => :horizon_s)
        ORDER BY c.next_run_at, c.cohort_id
        LIMIT :limit
    ) f
) d
WHERE d.upto - d.members < :limit;

-- name: lock_due_cohorts
-- Locks the cohorts :cohort_ids still due (within the horizon) for this pass, in id order, skipping any
-- another transaction holds (a member leaving, another pass: a later pass takes it). From here until the
-- pass commits no member can leave (leave_cohort waits) and no create joins (claim_cohorts skips it), so
-- the members read next, in a statement of its own (a snapshot taken after the locks), are the cohort's.
-- Returns each locked cohort with what its members share (a member's DueSchedule fields: spec, cursor, shard;
-- no end, calendar or run limit) and its members_version.
SELECT c.cohort_id, c.shard, c.next_run_at, c.members_version AS cohort_version, c.kind, c.expression,
       c.time_zone, c.dst_repeat, c.dst_gap, c.anchor, c.misfire_policy, c.max_lateness_s,
       NULL::timestamptz AS end_at, NULL::uuid AS calendar_id, NULL::integer AS max_runs
FROM schedule_cohorts c
WHERE c.cohort_id = ANY (:cohort_ids::uuid[])
  AND c.next_run_at <= coalesce(:now::timestamptz, now()) + make_interval(secs => :horizon_s)
ORDER BY c.cohort_id
FOR UPDATE SKIP LOCKED;

-- name: cohort_members
-- The active members of the locked cohorts :cohort_ids: only what differs between members (the rest of a
-- member's DueSchedule is its cohort's, from lock_due_cohorts: engine/records.py COHORT_FIELDS), with their
-- tenant's weight. A cohort without an active member comes back once with a NULL schedule_id (the pass
-- deletes it). LATERAL with OFFSET 0 (not flattened into a join): one range scan of schedules_cohort per
-- cohort; the planner's hash join read the whole table, ~160 ms per pass at 300,000 schedules. Each member
-- names its cohort by its position in :cohort_ids (cohort_n, from 1), not by id: a uuid read per member was
-- the row's dearest column to decode in the node.
SELECT c.cohort_n, s.schedule_id, s.tenant_id, s.start_at, s.version, s.target, s.payload::text AS payload_json,
       s.priority, s.flexible_window_s, s.deadline_s, s.overlap_policy, s.runs, coalesce(t.weight, 1) AS weight
FROM unnest(:cohort_ids::uuid[]) WITH ORDINALITY AS c (cohort_id, cohort_n)
LEFT JOIN LATERAL (
    SELECT * FROM schedules s WHERE s.cohort_id = c.cohort_id AND s.state = 'active' OFFSET 0
) s ON true
LEFT JOIN tenants t ON t.tenant_id = s.tenant_id;

-- name: materialize_staged
-- One statement per batch. First advances each schedule's cursor (:schedule_ids, :versions, :cursors as
-- read, :next_run_ats; NULL = no further fires or no run left: completed) and adds its new runs (:runs, the
-- SCHEDULED occurrences staged for it), joining it to cohort :join_cohort_ids (from its fires
-- :join_cohort_bases; NULL: it keeps its own cursor), only if version and cursor are still the ones read
-- (a concurrent update or pause wins and nothing is written for that schedule). Then, for the schedules
-- advanced, inserts the staged occurrences (:checked: an existing one is left alone and gets no second
-- delivery; not :checked: an existing one fails the statement with unique_violation) and each SCHEDULED
-- one's delivery: ahead-lane row when staged ahead, else an outbox row (held by the overlap gate with
-- :gate_token, or for the tenant's max_running with :tenant_token, when flagged) with late_after and
-- misfire_policy (lateness is judged again at dispatch), the missed_ranges rows (:range_*) of the advanced
-- schedules, and the quota usage change of the ones completed. Cohorts (:cohort_ids, :cohort_versions =
-- members_version as read, :cohort_cursors, :cohort_next_run_ats, :cohort_fires) advance likewise, once for
-- all their members, only if neither their cursor nor their membership moved; their members' staged rows
-- (cohort_id set) are inserted for the cohorts advanced. Cohorts :dissolve_ids (:dissolve_versions,
-- :dissolve_cursors; same condition) are deleted (their fire is not plain on-time work, or they have no
-- member left) and their members get their own cursor and runs: each one planned (:released_ids) advanced
-- as a schedule alone would be (:released_next_run_ats, :released_runs; its staged rows inserted), any other
-- at the cohort's cursor.
-- Returns the counts and the cohorts advanced.
WITH advanced AS (
    UPDATE schedules s
    SET next_run_at = u.next_run_at,
        runs = s.runs + u.runs,
        state = CASE WHEN u.next_run_at IS NULL THEN 'completed' ELSE s.state END,
        cohort_id = u.cohort_id, cohort_base = u.cohort_base,
        updated_at = coalesce(:now::timestamptz, now())
    FROM unnest(:schedule_ids::uuid[], :versions::int[], :cursors::timestamptz[], :next_run_ats::timestamptz[],
                :runs::int[], :join_cohort_ids::uuid[], :join_cohort_bases::bigint[])
         AS u (schedule_id, version, cursor, next_run_at, runs, cohort_id, cohort_base)
    WHERE s.schedule_id = u.schedule_id AND s.version = u.version AND s.state = 'active'
      AND s.next_run_at = u.cursor AND s.cohort_id IS NULL
    RETURNING s.schedule_id, s.tenant_id, s.state, s.fires_per_minute, s.cohort_id
), cohorts_advanced AS (
    UPDATE schedule_cohorts c
    SET next_run_at = u.next_run_at, fires = c.fires + u.fires, updated_at = coalesce(:now::timestamptz, now())
    FROM unnest(:cohort_ids::uuid[], :cohort_versions::bigint[], :cohort_cursors::timestamptz[],
                :cohort_next_run_ats::timestamptz[], :cohort_fires::int[])
         AS u (cohort_id, members_version, cursor, next_run_at, fires)
    WHERE c.cohort_id = u.cohort_id AND c.members_version = u.members_version AND c.next_run_at = u.cursor
    RETURNING c.cohort_id
), dissolved AS (
    DELETE FROM schedule_cohorts c
    USING unnest(:dissolve_ids::uuid[], :dissolve_versions::bigint[], :dissolve_cursors::timestamptz[])
          AS d (cohort_id, members_version, cursor)
    WHERE c.cohort_id = d.cohort_id AND c.members_version = d.members_version AND c.next_run_at = d.cursor
    RETURNING c.cohort_id, c.next_run_at, c.fires
), released AS (
    UPDATE schedules s
    SET cohort_id = NULL, cohort_base = NULL, next_run_at = r.next_run_at,
        runs = s.runs + (d.fires - s.cohort_base)::integer + r.runs,
        state = CASE WHEN r.next_run_at IS NULL THEN 'completed' ELSE s.state END,
        updated_at = coalesce(:now::timestamptz, now())
    FROM dissolved d,
         unnest(:released_ids::uuid[], :released_next_run_ats::timestamptz[], :released_runs::int[])
         AS r (schedule_id, next_run_at, runs)
    WHERE s.cohort_id = d.cohort_id AND s.schedule_id = r.schedule_id
    RETURNING s.schedule_id, s.tenant_id, s.state, s.fires_per_minute, s.cohort_id
), unplanned AS (
    -- A member the pass did not read (none should exist: members_version moves with every join) is never
    -- left pointing at a deleted cohort: it gets the cohort's cursor and is judged by a later pass.
    UPDATE schedules s
    SET cohort_id = NULL, cohort_base = NULL, next_run_at = d.next_run_at,
        runs = s.runs + (d.fires - s.cohort_base)::integer
    FROM dissolved d
    WHERE s.cohort_id = d.cohort_id AND s.schedule_id <> ALL (:released_ids::uuid[])
    RETURNING 1
), moved AS (
    SELECT * FROM advanced
    UNION ALL
    SELECT * FROM released
), ranges AS (
    -- missed slots summarised, not listed (count NULL: more than can be counted)
    INSERT INTO missed_ranges (schedule_id, schedule_version, first_missed, last_missed, missed_count, recorded_at)
    SELECT r.schedule_id, r.version, r.first_missed, r.last_missed, r.missed_count,
           coalesce(:now::timestamptz, now())
    FROM unnest(:range_schedule_ids::uuid[], :range_versions::int[], :range_firsts::timestamptz[],
                :range_lasts::timestamptz[], :range_counts::bigint[])
         AS r (schedule_id, version, first_missed, last_missed, missed_count)
    JOIN moved a ON a.schedule_id = r.schedule_id
    ON CONFLICT DO NOTHING
    RETURNING 1
), new_occurrences AS NOT MATERIALIZED (
    -- The staged occurrences of the schedules and cohorts advanced, as rows of occurrences (inlined into the
    -- one of the two inserts below that runs).
    SELECT m.occurrence_id, m.schedule_id, m.schedule_version, m.tenant_id, m.target,
           timestamptz 'epoch' + m.scheduled_us * interval '1 microsecond' AS scheduled_for,
           timestamptz 'epoch' + m.available_us * interval '1 microsecond' AS available_at, m.state,
           coalesce(:now::timestamptz, now()) AS created_at, coalesce(:now::timestamptz, now()) AS updated_at
    FROM materialize_staging m
    WHERE m.schedule_id IN (SELECT schedule_id FROM moved)
       OR m.cohort_id IN (SELECT cohort_id FROM cohorts_advanced)
), inserted_checked AS (
    -- :checked: an occurrence that exists already (by id or by slot) is left alone and gets no delivery.
    INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                             available_at, state, created_at, updated_at)
    SELECT * FROM new_occurrences WHERE :checked::boolean
    ON CONFLICT DO NOTHING
    RETURNING occurrence_id, state
), inserted_unchecked AS (
    -- Not :checked: every one is inserted, and one that exists already fails the statement (unique_violation).
    -- The speculative insert above probes each unique index once more per row and confirms each row (~3 µs of
    -- PostgreSQL's ~30 per row, docs/benchmarks.md stop 58), for conflicts only a replay or a race makes (an
    -- old node's replayed fire, a backfill of the slot racing the pass): the materializer runs the statement
    -- unchecked first, under a savepoint, and checked after a refusal.
    INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for,
                             available_at, state, created_at, updated_at)
    SELECT * FROM new_occurrences WHERE NOT :checked::boolean
    RETURNING occurrence_id, state
), inserted AS (
    SELECT * FROM inserted_checked
    UNION ALL
    SELECT * FROM inserted_unchecked
), ahead AS (
    INSERT INTO dispatch_queue (shard, lane, bucket, wrr_round, occurrence_id, tenant_id, topic, message_key,
                                message, scheduled_for, available_at, late_after, misfire_policy)
    SELECT m.shard, m.lane, timestamptz 'epoch' + m.bucket_us * interval '1 microsecond', m.wrr_round,
           m.occurrence_id, m.tenant_id, m.topic, m.message_key, m.message,
           timestamptz 'epoch' + m.scheduled_us * interval '1 microsecond',
           timestamptz 'epoch' + m.available_us * interval '1 microsecond',
           timestamptz 'epoch' + m.late_after_us * interval '1 microsecond', m.misfire_policy
    FROM materialize_staging m
    JOIN inserted i ON i.occurrence_id = m.occurrence_id
    WHERE i.state = 'SCHEDULED' AND m.ahead
    RETURNING 1
), late AS (
    INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at,
                        claim_token, claim_expires_at, created_at, late_after, misfire_policy)
    SELECT m.occurrence_id, m.tenant_id, m.topic, m.message_key, m.message,
           timestamptz 'epoch' + m.scheduled_us * interval '1 microsecond',
           timestamptz 'epoch' + m.available_us * interval '1 microsecond',
           CASE WHEN m.held THEN :gate_token::uuid WHEN m.tenant_held THEN :tenant_token::uuid END,
           CASE WHEN m.held OR m.tenant_held THEN 'infinity'::timestamptz END,
           coalesce(:now::timestamptz, now()), timestamptz 'epoch' + m.late_after_us * interval '1 microsecond',
           m.misfire_policy
    FROM materialize_staging m
    JOIN inserted i ON i.occurrence_id = m.occurrence_id
    WHERE i.state = 'SCHEDULED' AND NOT m.ahead
    RETURNING 1
), completions AS (
    -- Schedules completed here no longer count against their tenant's quotas: one usage change per tenant
    -- (migration 0024's row trigger leaves active → completed to this statement, the only writer of it:
    -- a trigger call per completion cost 5-9 µs, docs/benchmarks.md stop 44).
    INSERT INTO tenant_usage_changes (tenant_id, schedules, fires_per_minute)
    SELECT a.tenant_id, -count(*), -sum(a.fires_per_minute::numeric)
    FROM moved a
    WHERE a.state = 'completed'
    GROUP BY a.tenant_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS schedules, (SELECT count(*) FROM inserted) AS occurrences,
       (SELECT count(*) FROM ahead) AS ahead, (SELECT count(*) FROM late) AS late,
       (SELECT count(*) FROM ranges) AS ranges,
       coalesce((SELECT array_agg(cohort_id) FROM cohorts_advanced), '{}') AS cohorts,
       (SELECT count(*) FROM unplanned) AS unplanned,
       (SELECT count(*) FROM advanced WHERE cohort_id IS NOT NULL) AS joined;

-- name: due_backlog
-- Active schedules whose cursor is already in the past (work the materializer has not caught up with): those
-- with their own cursor, and the active members of cohorts whose cursor is.
SELECT (SELECT count(*) FROM schedules
        WHERE state = 'active' AND cohort_id IS NULL AND next_run_at <= coalesce(:now::timestamptz, now()))
     + (SELECT count(*) FROM schedule_cohorts c JOIN schedules s ON s.cohort_id = c.cohort_id
        WHERE c.next_run_at <= coalesce(:now::timestamptz, now()) AND s.state = 'active') AS count;

-- name: create_catch_up_buckets
-- The catch-up token buckets of :tenant_ids that have none yet, full (catch_up_per_minute tokens at now).
-- Tenants are taken in id order, the order lock_catch_up_buckets locks them in.
INSERT INTO tenant_catch_up_buckets (tenant_id, tokens, updated_at)
SELECT t.tenant_id, t.catch_up_per_minute, coalesce(:now::timestamptz, now())
FROM tenants t
WHERE t.tenant_id = ANY (:tenant_ids::text[])
ORDER BY t.tenant_id
ON CONFLICT (tenant_id) DO NOTHING;

-- name: lock_catch_up_buckets
-- The catch-up token buckets of :tenant_ids with each tenant's rate, locked FOR UPDATE in tenant order
-- (engine nodes share one budget per tenant: the transaction that enqueues writes the bucket back).
SELECT b.tenant_id, b.tokens, b.updated_at, t.catch_up_per_minute
FROM tenant_catch_up_buckets b
JOIN tenants t ON t.tenant_id = b.tenant_id
WHERE b.tenant_id = ANY (:tenant_ids::text[])
ORDER BY b.tenant_id
FOR UPDATE OF b;

-- name: store_catch_up_buckets
-- Writes the buckets back (:tenant_ids, :tokens, :updated_ats) in the transaction that took from them.
UPDATE tenant_catch_up_buckets b
SET tokens = u.tokens, updated_at = u.updated_at
FROM unnest(:tenant_ids::text[], :tokens::float8[], :updated_ats::timestamptz[]) AS u (tenant_id, tokens, updated_at)
WHERE b.tenant_id = u.tenant_id;
