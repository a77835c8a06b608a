-- Queries of the reconciler (engine/reconciler): what should exist in a window, recomputed from the
-- version history and the time contract, compared set-based with what does exist. Everything runs in one
-- REPEATABLE READ transaction on one connection; rc_* are its temporary tables (dropped at commit).
-- Windows are half-open: :window_from <= scheduled_for < :window_to.

-- name: reconcile_settings
-- Memory for the run's hash joins and aggregates (this transaction only).
SELECT set_config('work_mem', :work_mem::text, true);

-- name: create_run_occurrences
-- The run's copy of the window's occurrences (every check reads it). Temporary: dropped at the run's commit.
CREATE TEMP TABLE rc_occ (
    occurrence_id uuid, schedule_id uuid, schedule_version integer, tenant_id text, target text,
    scheduled_for timestamptz, state text, created_at timestamptz, updated_at timestamptz, origin text
) ON COMMIT DROP;

-- name: create_run_versions
-- The versions that can own a slot of the window, with their validity and rule (see collect_versions).
CREATE TEMP TABLE rc_versions (
    schedule_id uuid, version integer, tenant_id text, definition jsonb, cursor timestamptz,
    ended_at timestamptz, next_active_cursor timestamptz, has_next_active boolean, kind text, expression text,
    time_zone text, dst_repeat text, dst_gap text, anchor timestamptz, start_at timestamptz, end_at timestamptz,
    misfire_policy text, max_lateness_s bigint, filtered boolean, current_version integer, current_state text,
    current_cursor timestamptz
) ON COMMIT DROP;

-- name: create_run_cron_fires
-- Fire instants per cron group, as the time contract computed them for the window.
CREATE TEMP TABLE rc_cron_fires (expression text, time_zone text, dst_repeat text, dst_gap text,
                                 scheduled_for timestamptz) ON COMMIT DROP;

-- name: create_run_rate_periods
-- The period of each rate expression, as the time contract parses it.
CREATE TEMP TABLE rc_rate_periods (expression text, period_us bigint) ON COMMIT DROP;

-- name: create_run_once_instants
-- The instant of each one-time expression, as the time contract parses it.
CREATE TEMP TABLE rc_once_instants (expression text, instant timestamptz) ON COMMIT DROP;

-- name: create_run_filtered_slots
-- The slots of versions that went through the slot filter, kept or excluded.
CREATE TEMP TABLE rc_filtered_slots (schedule_id uuid, version integer, scheduled_for timestamptz,
                                     excluded boolean, uncertain boolean) ON COMMIT DROP;

-- name: create_run_slots
-- Every slot the versions produce in the window, and whether it must exist (see build_slots).
CREATE TEMP TABLE rc_slots (schedule_id uuid, version integer, scheduled_for timestamptz, excluded boolean,
                            required boolean, before_cursor boolean, uncertain boolean) ON COMMIT DROP;

-- name: create_run_anomalies
-- Slots without an occurrence and occurrences without a slot (see compare_slots).
CREATE TEMP TABLE rc_anomalies (anomaly text, schedule_id uuid, version integer, scheduled_for timestamptz,
                                occurrence_id uuid, state text, tenant_id text) ON COMMIT DROP;

-- name: create_run_missing
-- Missing slots with their reason (see missing_slots).
CREATE TEMP TABLE rc_missing (schedule_id uuid, version integer, scheduled_for timestamptz, tenant_id text,
                              reason text) ON COMMIT DROP;

-- name: create_run_unexpected
-- Unexpected occurrences with their reason (see unexpected_occurrences).
CREATE TEMP TABLE rc_unexpected (occurrence_id uuid, schedule_id uuid, schedule_version integer,
                                 scheduled_for timestamptz, tenant_id text, state text, reason text) ON COMMIT DROP;

-- name: create_run_effects
-- The consumer app's dedupe rows of the window, copied from its own database.
CREATE TEMP TABLE rc_effects (consumer_group text, occurrence_id uuid, schedule_id uuid,
                              schedule_version integer, scheduled_for timestamptz) ON COMMIT DROP;

-- name: collect_occurrences
-- The occurrences of the window (of one tenant, if :tenant_id is given), copied once: every check reads this copy.
-- Archived ones (history retention, migration 0013) count as existing: an occurrence is in exactly one of the
-- two tables. Hot ones in two parts, each through its own index: finished ones by tenant and time
-- (occurrences_finished_by_tenant), open ones from occurrences_open (in-flight work only; migration 0029).
INSERT INTO rc_occ
SELECT occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for, state, created_at,
       updated_at, origin
FROM occurrences
WHERE scheduled_for >= :window_from AND scheduled_for < :window_to
  AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
  AND state IN ('SUCCEEDED', 'DEAD', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')
UNION ALL
SELECT occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for, state, created_at,
       updated_at, origin
FROM occurrences
WHERE scheduled_for >= :window_from AND scheduled_for < :window_to
  AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
  AND state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
UNION ALL
SELECT occurrence_id, schedule_id, schedule_version, tenant_id, target, scheduled_for, state, created_at,
       updated_at, origin
FROM archive.occurrences
WHERE scheduled_for >= :window_from AND scheduled_for < :window_to
  AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id);

-- name: archived_in_window
-- How many of the window's occurrences (of one tenant, if :tenant_id is given) the run read from the archive,
-- and the newest archive horizon inside the window (NULL: no part of the window is archived); tenant '*' is
-- the horizon of the whole days moved (every tenant's).
SELECT (SELECT count(*) FROM archive.occurrences
        WHERE scheduled_for >= :window_from AND scheduled_for < :window_to
          AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS archived,
       (SELECT max(least(archived_before, :window_to::timestamptz)) FROM archive.horizons
        WHERE archived_before > :window_from
          AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id OR tenant_id = '*')) AS archived_before;

-- name: analyze_occurrences
-- Statistics for the run's copy of the window's occurrences (autovacuum never analyzes temporary tables).
ANALYZE rc_occ;

-- name: collect_versions
-- Every active schedule version that can own a slot of the window, with its validity:
--   cursor             the version's first slot (next_run_at recorded with the version),
--   ended_at           when the next version (any change) replaced it; its slots up to then must exist,
--   next_active_cursor the first slot of the next active version: from there on the slots are that one's
--                      (a pause rewinds the cursor, and the resume re-decides those slots itself).
-- Versions that ended up to :ahead_slack_s seconds before the window are kept: slots they materialized ahead of the
-- change may lie in the window. The schedule's current version, state and cursor tell a slot that is
-- merely not yet materialized (the cursor has not reached it) from one that was lost.
INSERT INTO rc_versions
WITH history AS (
    SELECT sv.schedule_id, sv.version, sv.tenant_id, sv.state, sv.definition, sv.next_run_at AS cursor,
           lead(sv.changed_at) OVER (PARTITION BY sv.schedule_id ORDER BY sv.version) AS ended_at
    FROM schedule_versions sv
    WHERE (:tenant_id::text IS NULL OR sv.tenant_id = :tenant_id)
), active AS (
    SELECT h.*,
           lead(h.cursor) OVER (PARTITION BY h.schedule_id ORDER BY h.version) AS next_active_cursor,
           (lead(h.version) OVER (PARTITION BY h.schedule_id ORDER BY h.version)) IS NOT NULL AS has_next_active
    FROM history h
    WHERE h.state = 'active'
)
SELECT a.schedule_id, a.version, a.tenant_id, a.definition, a.cursor, a.ended_at, a.next_active_cursor,
       a.has_next_active,
       a.definition ->> 'kind' AS kind,
       a.definition ->> 'expression' AS expression,
       coalesce(a.definition ->> 'time_zone', 'UTC') AS time_zone,
       coalesce(a.definition ->> 'dst_repeat', 'first') AS dst_repeat,
       coalesce(a.definition ->> 'dst_gap', 'skip') AS dst_gap,
       (a.definition ->> 'anchor')::timestamptz AS anchor,
       (a.definition ->> 'start_at')::timestamptz AS start_at,
       (a.definition ->> 'end_at')::timestamptz AS end_at,
       coalesce(a.definition ->> 'misfire_policy', 'fire_once') AS misfire_policy,
       coalesce((a.definition ->> 'max_lateness')::bigint, 60) AS max_lateness_s,
       false AS filtered,
       s.version AS current_version, s.state AS current_state,
       coalesce((SELECT c.next_run_at FROM schedule_cohorts c WHERE c.cohort_id = s.cohort_id), s.next_run_at)
           AS current_cursor
FROM active a
JOIN schedules s ON s.schedule_id = a.schedule_id
WHERE a.cursor IS NOT NULL AND a.cursor < :window_to
  AND (a.ended_at IS NULL OR a.ended_at >= :window_from::timestamptz - make_interval(secs => :ahead_slack_s));

-- name: analyze_versions
-- Statistics for the run's versions (autovacuum never analyzes temporary tables).
ANALYZE rc_versions;

-- name: mark_filtered_versions
-- Versions whose definition names any of the fields in :fields go through the reconciler's slot filter
-- (calendars and exclusions) one by one instead of the grouped, set-based path.
UPDATE rc_versions SET filtered = true WHERE definition ?| :fields::text[];

-- name: cron_groups
-- The distinct cron time rules among the versions: fire instants are computed once per group.
SELECT DISTINCT expression, time_zone, dst_repeat, dst_gap
FROM rc_versions WHERE kind = 'cron' AND NOT filtered;

-- name: rate_expressions
-- The distinct rate periods among the versions (parsed by the time contract, applied here in SQL).
SELECT DISTINCT expression FROM rc_versions WHERE kind = 'rate' AND NOT filtered;

-- name: once_expressions
-- The distinct one-time instants among the versions.
SELECT DISTINCT expression FROM rc_versions WHERE kind = 'once' AND NOT filtered;

-- name: filtered_versions
-- The versions that go through the slot filter, with everything their fires depend on.
SELECT schedule_id, version, tenant_id, definition, kind, expression, time_zone, dst_repeat, dst_gap, anchor,
       start_at, end_at, cursor
FROM rc_versions WHERE filtered;

-- name: build_slots
-- Every slot each version produces in the window, and whether it must exist:
--   required  from the version's cursor, not after the next change, before the next active version's cursor;
--   otherwise optional (materialized ahead before a change; if it exists it must be CANCELED);
--   before_cursor earlier than the version's cursor: only a backfill (origin 'backfill') may fill it;
--   excluded  removed by the slot filter (if it exists it must not have run);
--   uncertain the filter cannot tell (anything that exists, or nothing, is accepted).
-- cron: the group's fires; rate: anchor + k * period (k >= 0; anchor, else start_at, else the epoch);
-- once: the instant. start_at/end_at are inclusive bounds.
INSERT INTO rc_slots
WITH produced AS (
    SELECT v.schedule_id, v.version, f.scheduled_for, false AS excluded, false AS uncertain, v.cursor, v.ended_at,
           v.has_next_active, v.next_active_cursor
    FROM rc_versions v
    JOIN rc_cron_fires f USING (expression, time_zone, dst_repeat, dst_gap)
    WHERE v.kind = 'cron' AND NOT v.filtered
      AND (v.start_at IS NULL OR f.scheduled_for >= v.start_at)
      AND (v.end_at IS NULL OR f.scheduled_for <= v.end_at)
    UNION ALL
    SELECT r.schedule_id, r.version, r.base + (k * r.period_us) * interval '1 microsecond', false, false, r.cursor,
           r.ended_at, r.has_next_active, r.next_active_cursor
    FROM (
        SELECT v.schedule_id, v.version, p.period_us, v.cursor, v.ended_at, v.has_next_active, v.next_active_cursor,
               coalesce(v.anchor, v.start_at, 'epoch'::timestamptz) AS base,
               greatest(:window_from::timestamptz, coalesce(v.start_at, '-infinity'::timestamptz)) AS low,
               least(:window_to::timestamptz - interval '1 microsecond', coalesce(v.end_at, 'infinity'::timestamptz)) AS high
        FROM rc_versions v
        JOIN rc_rate_periods p USING (expression)
        WHERE v.kind = 'rate' AND NOT v.filtered
    ) r,
    LATERAL generate_series(
        greatest(0, ceil((extract(epoch FROM r.low - r.base) * 1000000) / r.period_us)::bigint),
        floor((extract(epoch FROM r.high - r.base) * 1000000) / r.period_us)::bigint) AS k
    WHERE r.low <= r.high
    UNION ALL
    SELECT v.schedule_id, v.version, o.instant, false, false, v.cursor, v.ended_at, v.has_next_active,
           v.next_active_cursor
    FROM rc_versions v
    JOIN rc_once_instants o USING (expression)
    WHERE v.kind = 'once' AND NOT v.filtered
      AND (v.start_at IS NULL OR o.instant >= v.start_at)
      AND (v.end_at IS NULL OR o.instant <= v.end_at)
    UNION ALL
    SELECT f.schedule_id, f.version, f.scheduled_for, f.excluded, f.uncertain, v.cursor, v.ended_at,
           v.has_next_active, v.next_active_cursor
    FROM rc_filtered_slots f
    JOIN rc_versions v USING (schedule_id, version)
)
SELECT schedule_id, version, scheduled_for, excluded,
       NOT excluded AND NOT uncertain
         AND scheduled_for >= cursor
         AND (ended_at IS NULL OR scheduled_for <= ended_at)
         AND (NOT has_next_active OR next_active_cursor IS NULL OR scheduled_for < next_active_cursor) AS required,
       scheduled_for < cursor AS before_cursor,
       uncertain
FROM produced
WHERE scheduled_for >= :window_from AND scheduled_for < :window_to;

-- name: analyze_slots
-- Statistics for the run's slots (autovacuum never analyzes temporary tables).
ANALYZE rc_slots;

-- name: occurrence_origins
-- How many occurrences of the window each origin gave: the schedule's own slots, backfills, manual triggers.
SELECT origin, count(*) AS occurrences FROM rc_occ GROUP BY origin;

-- name: occurrence_states
-- How many occurrences of the window are in each state.
SELECT state, count(*) AS occurrences FROM rc_occ GROUP BY state;

-- name: compare_slots
-- One pass over slots and the window's slot occurrences (manual "trigger now" ones are no slot's; joined
-- on schedule, version, instant): every anomaly is kept in rc_anomalies for classification:
--   missing       a required slot without an occurrence,
--   unmatched     an occurrence no slot of the window's versions produces,
--   ran_excluded  an occurrence of an excluded slot that was not kept from running,
--   before_cursor an occurrence of a slot before its version's cursor that no backfill asked for,
--   live_after    an occurrence of an optional slot (after its version ended) that was not CANCELED.
INSERT INTO rc_anomalies
SELECT CASE WHEN o.occurrence_id IS NULL THEN 'missing'
            WHEN s.schedule_id IS NULL THEN 'unmatched'
            WHEN s.excluded THEN 'ran_excluded'
            WHEN s.before_cursor THEN 'before_cursor'
            ELSE 'live_after' END AS anomaly,
       coalesce(s.schedule_id, o.schedule_id) AS schedule_id,
       coalesce(s.version, o.schedule_version) AS version,
       coalesce(s.scheduled_for, o.scheduled_for) AS scheduled_for,
       o.occurrence_id, o.state, o.tenant_id
FROM rc_slots s
FULL JOIN (SELECT * FROM rc_occ WHERE origin <> 'manual') o
       ON o.schedule_id = s.schedule_id AND o.schedule_version = s.version AND o.scheduled_for = s.scheduled_for
WHERE (s.required AND o.occurrence_id IS NULL)
   OR (s.schedule_id IS NULL AND o.occurrence_id IS NOT NULL)
   OR (s.excluded AND o.state NOT IN ('CANCELED', 'MISSED', 'SKIPPED_OVERLAP'))
   OR (s.before_cursor AND NOT s.excluded AND NOT s.uncertain AND o.origin <> 'backfill')
   OR (NOT s.required AND NOT s.excluded AND NOT s.before_cursor AND NOT s.uncertain AND o.state <> 'CANCELED');

-- name: analyze_anomalies
-- Statistics for the run's anomalies (autovacuum never analyzes temporary tables).
ANALYZE rc_anomalies;

-- name: slot_totals
-- Slots from their version's cursor on that must exist, those of them that do (in any state), optional,
-- excluded and uncertain ones.
SELECT t.expected, t.expected - (SELECT count(*) FROM rc_anomalies WHERE anomaly = 'missing') AS present,
       t.optional, t.excluded, t.uncertain
FROM (SELECT count(*) FILTER (WHERE required) AS expected,
             count(*) FILTER (WHERE NOT required AND NOT excluded AND NOT uncertain) AS optional,
             count(*) FILTER (WHERE excluded) AS excluded,
             count(*) FILTER (WHERE uncertain) AS uncertain
      FROM rc_slots
      WHERE NOT before_cursor) t;

-- name: missing_slots
-- Required slots without an occurrence, classified:
--   summarized                inside a missed range of the same version (recorded, not enumerated),
--   pending                   the schedule's current cursor has not reached the slot yet (not lost:
--                             the materializer is behind and its misfire decision will cover the slot),
--   after_completion          after the last run of a schedule that completed (its max_runs reached),
--   superseded_unmaterialized the version was replaced before the slot was materialized,
--   lost                      the cursor moved past the slot and nothing records it.
INSERT INTO rc_missing
SELECT a.schedule_id, a.version, a.scheduled_for, v.tenant_id,
       CASE
           WHEN EXISTS (SELECT 1 FROM missed_ranges m
                        WHERE m.schedule_id = a.schedule_id AND m.schedule_version = a.version
                          AND a.scheduled_for BETWEEN m.first_missed AND m.last_missed) THEN 'summarized'
           WHEN v.version = v.current_version AND v.current_state = 'active'
                AND v.current_cursor <= a.scheduled_for THEN 'pending'
           WHEN v.version = v.current_version AND v.current_state = 'completed'
                AND a.scheduled_for > coalesce(greatest(
                        (SELECT max(o.scheduled_for) FROM occurrences o
                         WHERE o.schedule_id = a.schedule_id AND o.origin = 'schedule' AND o.state <> 'MISSED'),
                        (SELECT max(o.scheduled_for) FROM archive.occurrences o  -- its last run may be archived
                         WHERE o.schedule_id = a.schedule_id AND o.origin = 'schedule' AND o.state <> 'MISSED')),
                    '-infinity') THEN 'after_completion'
           WHEN v.ended_at IS NOT NULL THEN 'superseded_unmaterialized'
           ELSE 'lost'
       END AS reason
FROM rc_anomalies a
JOIN rc_versions v ON v.schedule_id = a.schedule_id AND v.version = a.version
WHERE a.anomaly = 'missing';

-- name: missing_counts
-- Missing slots per reason.
SELECT reason, count(*) AS slots FROM rc_missing GROUP BY reason;

-- name: missing_offenders
-- The first :limit missing slots of each reason that breaks the promise, oldest first.
SELECT schedule_id, version, scheduled_for, tenant_id, reason
FROM (SELECT m.*, row_number() OVER (PARTITION BY reason ORDER BY scheduled_for, schedule_id) AS n
      FROM rc_missing m WHERE reason IN ('lost', 'superseded_unmaterialized')) ranked
WHERE n <= :limit
ORDER BY scheduled_for, schedule_id;

-- name: unexpected_occurrences
-- Occurrences no version accounts for, with the reason:
--   unknown_version           no such schedule version in the history,
--   version_not_active        the version was paused or canceled: it produces nothing,
--   before_version_cursor     earlier than the version's first slot,
--   not_a_fire_time           the version's time rule does not fire then,
--   excluded_slot_ran         the slot filter excludes the slot, yet it was not kept from running,
--   live_after_version_ended  materialized ahead of a change and not CANCELED by it.
-- An occurrence of a version that ended long before the window is accounted for only if CANCELED.
INSERT INTO rc_unexpected
SELECT * FROM (
    SELECT a.occurrence_id, a.schedule_id, a.version AS schedule_version, a.scheduled_for, a.tenant_id, a.state,
           CASE
               WHEN a.anomaly = 'ran_excluded' THEN 'excluded_slot_ran'
               WHEN a.anomaly = 'before_cursor' THEN 'before_version_cursor'
               WHEN a.anomaly = 'live_after' THEN 'live_after_version_ended'
               WHEN sv.schedule_id IS NULL THEN 'unknown_version'
               WHEN sv.state <> 'active' THEN 'version_not_active'
               WHEN a.scheduled_for < sv.next_run_at THEN 'before_version_cursor'
               WHEN v.schedule_id IS NOT NULL THEN 'not_a_fire_time'
               WHEN a.state = 'CANCELED' THEN NULL
               ELSE 'live_after_version_ended'
           END AS reason
    FROM rc_anomalies a
    LEFT JOIN schedule_versions sv ON sv.schedule_id = a.schedule_id AND sv.version = a.version
    LEFT JOIN rc_versions v ON v.schedule_id = a.schedule_id AND v.version = a.version
    WHERE a.anomaly <> 'missing'
) judged
WHERE reason IS NOT NULL;

-- name: unexpected_counts
-- Unexpected occurrences per reason.
SELECT reason, count(*) AS occurrences FROM rc_unexpected GROUP BY reason;

-- name: unexpected_states
-- Unexpected occurrences per state.
SELECT state, count(*) AS occurrences FROM rc_unexpected GROUP BY state;

-- name: unexpected_offenders
-- The first :limit unexpected occurrences, oldest first.
SELECT occurrence_id, schedule_id, schedule_version, scheduled_for, tenant_id, state, reason
FROM rc_unexpected ORDER BY scheduled_for, occurrence_id LIMIT :limit;

-- name: duplicate_slots
-- Slots (schedule, instant) with more than one occurrence that may run: at most one may (a manual "trigger
-- now" occurrence is no slot's and never counts).
-- Returns the count and the first :limit of them.
WITH keys AS (
    SELECT schedule_id, scheduled_for
    FROM rc_occ
    WHERE state NOT IN ('CANCELED', 'MISSED', 'SKIPPED_OVERLAP') AND origin <> 'manual'
    GROUP BY schedule_id, scheduled_for
    HAVING count(*) > 1
), duplicated AS (
    SELECT o.schedule_id, o.scheduled_for, count(*) AS live,
           array_agg(o.occurrence_id ORDER BY o.schedule_version) AS occurrence_ids,
           array_agg(o.schedule_version ORDER BY o.schedule_version) AS versions,
           array_agg(o.state ORDER BY o.schedule_version) AS states,
           min(o.tenant_id) AS tenant_id
    FROM (SELECT * FROM keys ORDER BY scheduled_for, schedule_id LIMIT :limit) k
    JOIN rc_occ o USING (schedule_id, scheduled_for)
    WHERE o.state NOT IN ('CANCELED', 'MISSED', 'SKIPPED_OVERLAP') AND o.origin <> 'manual'
    GROUP BY o.schedule_id, o.scheduled_for
)
SELECT (SELECT count(*) FROM keys) AS total, d.*
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT * FROM duplicated ORDER BY scheduled_for, schedule_id) d ON true;

-- name: policy_violations
-- Misfire decisions that enqueued more late slots than their policy allows (backfills and manual triggers
-- are requests, not misfire decisions, and are not judged here): occurrences written by
-- one materializer decision share (schedule, version, created_at); a slot is late when it was written
-- more than max_lateness (capped by :on_time_limit_s seconds, the engine's on-time limit, when given) plus :tolerance_s seconds
-- of tolerance after its instant. skip allows none, fire_once one, catch_up:K K.
-- Returns the count and the first :limit.
WITH late AS (
    SELECT o.schedule_id, o.schedule_version, o.created_at, min(o.tenant_id) AS tenant_id,
           v.misfire_policy, count(*) AS late_enqueued,
           min(o.scheduled_for) AS first_slot, max(o.scheduled_for) AS last_slot
    FROM (SELECT * FROM rc_occ WHERE created_at > scheduled_for AND state <> 'MISSED' AND origin = 'schedule') o
    JOIN rc_versions v ON v.schedule_id = o.schedule_id AND v.version = o.schedule_version
    WHERE o.created_at - o.scheduled_for
          > make_interval(secs => least(v.max_lateness_s, coalesce(:on_time_limit_s::double precision, v.max_lateness_s)) + :tolerance_s)
    GROUP BY o.schedule_id, o.schedule_version, o.created_at, v.misfire_policy
), violating AS (
    SELECT l.*,
           CASE WHEN l.misfire_policy = 'skip' THEN 0
                WHEN l.misfire_policy = 'fire_once' THEN 1
                ELSE coalesce(nullif(split_part(l.misfire_policy, ':', 2), '')::int, 0) END AS allowed
    FROM late l
)
SELECT (SELECT count(*) FROM violating WHERE late_enqueued > allowed) AS total, d.*
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT * FROM violating WHERE late_enqueued > allowed
                   ORDER BY first_slot, schedule_id LIMIT :limit) d ON true;

-- name: unfinished_occurrences
-- Occurrences of the window not in a final state: how many, how many have not moved for longer than
-- :stuck_after_s seconds before the run's instant :now (stuck), and the first :limit stuck ones.
WITH unfinished AS (
    SELECT * FROM rc_occ WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
), stuck AS (
    SELECT * FROM unfinished WHERE updated_at < :now::timestamptz - make_interval(secs => :stuck_after_s)
)
SELECT (SELECT count(*) FROM unfinished) AS unfinished, (SELECT count(*) FROM stuck) AS total, d.*
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT occurrence_id, schedule_id, schedule_version, scheduled_for, tenant_id, state,
                          updated_at
                   FROM stuck ORDER BY updated_at, occurrence_id LIMIT :limit) d ON true;

-- name: version_totals
-- How many schedules and versions the run judged.
SELECT count(DISTINCT schedule_id) AS schedules, count(*) AS versions FROM rc_versions;

-- name: analyze_effects
-- Statistics for the consumer's effects copied into the run (autovacuum never analyzes temporary tables).
ANALYZE rc_effects;

-- name: effect_problems
-- Effects compared with the engine's occurrences of the window:
--   applied_twice          one slot's effect applied under two occurrences by the same consumer group
--                          (a manual "trigger now" occurrence is no slot's),
--   applied_unknown        an effect for an occurrence the engine does not have,
--   applied_not_to_run     an effect for an occurrence the engine MISSED or SKIPPED_OVERLAP (never to run),
--   applied_after_cancel   an effect for an occurrence the engine CANCELED: a pause, update or cancel
--                          raced a consumer that was already applying it (the effect ran once; the
--                          engine's record says CANCELED),
--   applied_unrecorded     an effect whose occurrence the engine does not know SUCCEEDED (DEAD, or
--                          not final and not moved for :stuck_after_s seconds before :now: its attempt events were lost),
--   never_applied          SUCCEEDED, of a target this consumer handles (:targets, else every target it applied),
--                          yet no effect.
-- Returns one row per problem (kind, occurrence, slot), the first :limit of each kind, and the totals.
WITH targets AS (
    SELECT DISTINCT o.target FROM rc_effects e JOIN rc_occ o USING (occurrence_id)
    WHERE :targets::text[] IS NULL
    UNION
    SELECT unnest(:targets::text[])
), problems AS (
    SELECT 'applied_twice' AS kind, NULL::uuid AS occurrence_id, e.schedule_id, e.scheduled_for,
           string_agg(e.occurrence_id::text, ',' ORDER BY e.schedule_version) AS detail
    FROM rc_effects e
    WHERE NOT EXISTS (SELECT 1 FROM rc_occ o WHERE o.occurrence_id = e.occurrence_id AND o.origin = 'manual')
    GROUP BY e.consumer_group, e.schedule_id, e.scheduled_for
    HAVING count(DISTINCT e.occurrence_id) > 1
    UNION ALL
    SELECT 'applied_unknown', e.occurrence_id, e.schedule_id, e.scheduled_for, e.consumer_group
    FROM rc_effects e
    WHERE NOT EXISTS (SELECT 1 FROM rc_occ o WHERE o.occurrence_id = e.occurrence_id)
    UNION ALL
    SELECT CASE WHEN o.state = 'CANCELED' THEN 'applied_after_cancel'
                WHEN o.state IN ('MISSED', 'SKIPPED_OVERLAP') THEN 'applied_not_to_run'
                ELSE 'applied_unrecorded' END,
           o.occurrence_id, o.schedule_id, o.scheduled_for, e.consumer_group || ' ' || o.state
    FROM rc_effects e
    JOIN rc_occ o USING (occurrence_id)
    WHERE o.state IN ('CANCELED', 'MISSED', 'SKIPPED_OVERLAP', 'DEAD')
       OR (o.state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
           AND o.updated_at < :now::timestamptz - make_interval(secs => :stuck_after_s))
    UNION ALL
    SELECT 'never_applied', o.occurrence_id, o.schedule_id, o.scheduled_for, o.target
    FROM rc_occ o
    WHERE o.state = 'SUCCEEDED' AND o.target IN (SELECT target FROM targets)
      AND NOT EXISTS (SELECT 1 FROM rc_effects e WHERE e.occurrence_id = o.occurrence_id)
), ranked AS (
    SELECT p.*, row_number() OVER (PARTITION BY kind ORDER BY scheduled_for, schedule_id) AS n,
           count(*) OVER (PARTITION BY kind) AS total
    FROM problems p
)
SELECT kind, occurrence_id, schedule_id, scheduled_for, detail, total FROM ranked WHERE n <= :limit
ORDER BY kind, scheduled_for;

-- name: effect_totals
-- How many effects were checked, and how many groups applied them.
SELECT count(*) AS effects, count(DISTINCT consumer_group) AS groups FROM rc_effects;

-- name: record_run
-- Stores one reconcile run for `chronoq status` and dashboards.
INSERT INTO reconcile_runs (started_at, finished_at, window_from, window_to, tenant_id, clean, counts,
                            offenders, duration_s)
VALUES (:started_at, :finished_at, :window_from, :window_to, :tenant_id, :clean, :counts, :offenders,
        :duration_s)
RETURNING run_id;

-- name: calendar_of_version
-- The exclusion calendar a schedule version names (:name): the schedule's own reference when it names that
-- calendar, else the tenant's calendar of that name (the live one first; a deleted one keeps its history).
SELECT coalesce(
    (SELECT calendar_id FROM schedules WHERE schedule_id = :schedule_id AND calendar_name = :name),
    (SELECT calendar_id FROM calendars WHERE tenant_id = :tenant_id AND name = :name
     ORDER BY deleted_at IS NULL DESC, created_at DESC LIMIT 1)
) AS calendar_id;
