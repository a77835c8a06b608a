-- Batch create (engine/control/schedule_batches.py): set-based writes of up to a thousand schedules.
-- :now is NULL in production, a fixed instant in tests.

-- name: schedules_by_keys
-- The schedules a tenant created with any of these idempotency keys (members' cursors from their cohorts).
SELECT e.* FROM schedules s CROSS JOIN LATERAL chronoq_effective_schedule(s) e
WHERE s.tenant_id = :tenant_id AND s.created_by_key = ANY (:keys::text[]);

-- name: insert_schedules
-- Creates a batch of active schedules of one tenant from column arrays (cohort members with their cohort and
-- base, claim_cohorts); a key already taken (a concurrent request with the same key) is skipped and returns
-- nothing for that item.
INSERT INTO schedules (
    schedule_id, tenant_id, kind, expression, time_zone, dst_repeat, dst_gap, anchor, start_at, end_at,
    next_run_at, state, target, payload, priority, flexible_window_s, misfire_policy, max_lateness_s,
    overlap_policy, retry_max_attempts, retry_base_s, retry_cap_s, deadline_s, shard, created_by_key,
    fires_per_minute, request_hash, calendar_id, calendar_name, max_runs, cohort_id, cohort_base, created_at,
    updated_at)
SELECT t.schedule_id, :tenant_id, t.kind, t.expression, t.time_zone, t.dst_repeat, t.dst_gap, t.anchor,
       t.start_at, t.end_at, t.next_run_at, 'active', t.target, t.payload, t.priority, t.flexible_window_s,
       t.misfire_policy, t.max_lateness_s, t.overlap_policy, t.retry_max_attempts, t.retry_base_s, t.retry_cap_s,
       t.deadline_s, t.shard, t.created_by_key, t.fires_per_minute, t.request_hash, t.calendar_id, t.calendar_name,
       t.max_runs, t.cohort_id, t.cohort_base, coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now())
FROM unnest(:schedule_ids::uuid[], :kinds::text[], :expressions::text[], :time_zones::text[], :dst_repeats::text[],
            :dst_gaps::text[], :anchors::timestamptz[], :start_ats::timestamptz[], :end_ats::timestamptz[],
            :next_run_ats::timestamptz[], :targets::text[], :payloads::jsonb[], :priorities::text[],
            :flexible_window_ss::int[], :misfire_policies::text[], :max_lateness_ss::int[],
            :overlap_policies::text[], :retry_max_attemptss::int[], :retry_base_ss::double precision[],
            :retry_cap_ss::double precision[], :deadline_ss::int[], :shards::int[], :created_by_keys::text[],
            :fires_per_minutes::double precision[], :request_hashes::text[], :calendar_ids::uuid[],
            :calendar_names::text[], :max_runss::int[], :cohort_ids::uuid[], :cohort_bases::bigint[])
     AS t(schedule_id, kind, expression, time_zone, dst_repeat, dst_gap, anchor, start_at, end_at, next_run_at,
          target, payload, priority, flexible_window_s, misfire_policy, max_lateness_s, overlap_policy,
          retry_max_attempts, retry_base_s, retry_cap_s, deadline_s, shard, created_by_key, fires_per_minute,
          request_hash, calendar_id, calendar_name, max_runs, cohort_id, cohort_base)
ON CONFLICT (tenant_id, created_by_key) WHERE created_by_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: insert_first_versions
-- Records version 1 ("create") of a batch of new schedules of one tenant.
INSERT INTO schedule_versions (schedule_id, version, tenant_id, change, state, definition, next_run_at, changed_at)
SELECT t.schedule_id, t.version, :tenant_id, 'create', t.state, t.definition, t.next_run_at,
       coalesce(:now::timestamptz, now())
FROM unnest(:schedule_ids::uuid[], :versions::int[], :states::text[], :definitions::jsonb[],
            :next_run_ats::timestamptz[]) AS t(schedule_id, version, state, definition, next_run_at);

-- name: insert_topic_messages
-- Queues messages that belong to no occurrence (the schedule states of a batch) for the relay, in the
-- transaction of the change they report.
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at, created_at)
SELECT NULL, :tenant_id, :topic, t.message_key, t.message, coalesce(:now::timestamptz, now()),
       coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now())
FROM unnest(:message_keys::bytea[], :messages::bytea[]) AS t(message_key, message);
