-- Schedule cohorts (migration 0026; engine/rules/cohorts.py): joining one at create, leaving one before any
-- change of a member. The materializer's side is in materializer.sql. :now is NULL in production (the
-- database's clock rules), a fixed instant in tests.

-- name: claim_cohorts
-- For schedules about to join (a create's new ones, or those a materializer pass advances): one cohort per
-- group (:tenant_ids, :shards, :spec_keys, :next_run_ats, :counts schedules each, pairwise; a new cohort
-- stores the key's fields :kinds, :expressions, :time_zones, :dst_repeats, :dst_gaps, :anchors,
-- :misfire_policies, :max_lateness_ss), for the write that follows in the same transaction. An existing
-- cohort with the key and cursor and room for the group (:cap members) is taken unless another transaction
-- holds it (SKIP LOCKED: a claim never waits for a materializer pass or a member's change; it makes a new
-- cohort, with :new_ids, instead). Every cohort taken moves its members_version (a pass's compare-and-set
-- names the membership it read). Returns, per group (:ordinals), the cohort and its fires so far (the
-- members' base).
WITH wanted AS (
    SELECT * FROM unnest(:ordinals::int[], :tenant_ids::text[], :shards::int[], :spec_keys::text[],
                         :next_run_ats::timestamptz[], :counts::int[], :new_ids::uuid[], :kinds::text[],
                         :expressions::text[], :time_zones::text[], :dst_repeats::text[], :dst_gaps::text[],
                         :anchors::timestamptz[], :misfire_policies::text[], :max_lateness_ss::int[])
         AS w (ordinal, tenant_id, shard, spec_key, next_run_at, n, new_id, kind, expression, time_zone,
               dst_repeat, dst_gap, anchor, misfire_policy, max_lateness_s)
), found AS (
    SELECT w.ordinal, w.n, f.cohort_id
    FROM wanted w
    CROSS JOIN LATERAL (
        SELECT c.cohort_id
        FROM schedule_cohorts c
        WHERE c.shard = w.shard AND c.tenant_id = w.tenant_id AND c.spec_key = w.spec_key
          AND c.next_run_at = w.next_run_at AND c.members + w.n <= :cap
        ORDER BY c.cohort_id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) f
), taken AS (
    UPDATE schedule_cohorts c
    SET members = c.members + f.n, members_version = c.members_version + 1,
        updated_at = coalesce(:now::timestamptz, now())
    FROM found f
    WHERE c.cohort_id = f.cohort_id
    RETURNING f.ordinal, c.cohort_id, c.fires
), made AS (
    INSERT INTO schedule_cohorts (cohort_id, shard, tenant_id, spec_key, kind, expression, time_zone, dst_repeat,
                                  dst_gap, anchor, misfire_policy, max_lateness_s, next_run_at, fires, members,
                                  members_version, created_at, updated_at)
    SELECT w.new_id, w.shard, w.tenant_id, w.spec_key, w.kind, w.expression, w.time_zone, w.dst_repeat, w.dst_gap,
           w.anchor, w.misfire_policy, w.max_lateness_s, w.next_run_at, 0, w.n, 0,
           coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now())
    FROM wanted w
    WHERE w.ordinal NOT IN (SELECT ordinal FROM taken)
    RETURNING cohort_id, fires
)
SELECT t.ordinal, t.cohort_id, t.fires FROM taken t
UNION ALL
SELECT w.ordinal, m.cohort_id, m.fires FROM made m JOIN wanted w ON w.new_id = m.cohort_id;

-- name: leave_cohort
-- Takes schedule :schedule_id of :tenant_id out of its cohort, if it is in one, before any change of it:
-- its own cursor and runs become its cohort's (what it would have had alone), and the cohort's
-- members_version moves. Waits for a pass that holds the cohort (a pass locks its cohorts before it reads
-- their members), so what the pass wrote is visible to the change's next statements. Returns whether it
-- left one.
WITH member AS (
    SELECT cohort_id FROM schedules
    WHERE schedule_id = :schedule_id AND tenant_id = :tenant_id AND cohort_id IS NOT NULL
), cohort AS (
    UPDATE schedule_cohorts c
    SET members = c.members - 1, members_version = c.members_version + 1,
        updated_at = coalesce(:now::timestamptz, now())
    FROM member m
    WHERE c.cohort_id = m.cohort_id
    RETURNING c.cohort_id, c.next_run_at, c.fires
), left_it AS (
    UPDATE schedules s
    SET cohort_id = NULL, cohort_base = NULL, next_run_at = c.next_run_at,
        runs = s.runs + (c.fires - s.cohort_base)::integer
    FROM cohort c
    WHERE s.schedule_id = :schedule_id AND s.cohort_id = c.cohort_id
    RETURNING 1
)
SELECT count(*) > 0 AS left_cohort FROM left_it;
