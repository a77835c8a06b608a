-- Health as the engine database sees it: last-hour lag and throughput, backlogs now. A :tenant_id that is
-- NULL means every tenant. :now is NULL in production (the database's clock rules), a fixed instant in tests.

-- name: health_window
-- The last :minutes (by scheduled_for), read once: a row per minute (whole = false) and one for the whole
-- window (whole = true, minute NULL; there even when the window is empty). Each: occurrences, how many reached
-- Kafka, succeeded, went DEAD or MISSED, the enqueued slot ones (origin 'schedule') and their schedule_lag
-- percentiles p50, p95, p99 (enqueued_at - scheduled_for; NULL when there are none).
WITH recent AS (
    -- The window's occurrences in two parts, each through its own index (migration 0029): finished ones by
    -- tenant and time (occurrences_finished_by_tenant), open ones from occurrences_open (in-flight work only).
    SELECT scheduled_for, enqueued_at, state, origin FROM occurrences
    WHERE (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
      AND scheduled_for > coalesce(:now::timestamptz, now()) - make_interval(mins => :minutes)
      AND scheduled_for <= coalesce(:now::timestamptz, now())
      AND state IN ('SUCCEEDED', 'DEAD', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')
    UNION ALL
    SELECT scheduled_for, enqueued_at, state, origin FROM occurrences
    WHERE (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
      AND scheduled_for > coalesce(:now::timestamptz, now()) - make_interval(mins => :minutes)
      AND scheduled_for <= coalesce(:now::timestamptz, now())
      AND state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
)
SELECT grouping(date_trunc('minute', scheduled_for)) = 1 AS whole,
       date_trunc('minute', scheduled_for) AS minute,
       count(*) AS occurrences,
       count(*) FILTER (WHERE enqueued_at IS NOT NULL) AS enqueued,
       count(*) FILTER (WHERE state = 'SUCCEEDED') AS succeeded,
       count(*) FILTER (WHERE state = 'DEAD') AS dead,
       count(*) FILTER (WHERE state = 'MISSED') AS missed,
       count(*) FILTER (WHERE enqueued_at IS NOT NULL AND origin = 'schedule') AS enqueued_slots,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM enqueued_at - scheduled_for))
           FILTER (WHERE enqueued_at IS NOT NULL AND origin = 'schedule') AS lag
FROM recent
GROUP BY GROUPING SETS ((date_trunc('minute', scheduled_for)), ())
ORDER BY 2;

-- name: backlogs
-- The backlogs now: active schedules whose cursor is past (the materializer's due backlog), due unsent
-- outbox rows (as the relay's outbox_backlog counts them) and the age of the oldest one (queue age), unsent
-- rows held by the overlap gate (some of them due), and occurrences running, waiting for a retry, or DEAD.
SELECT
    (SELECT count(*) FROM schedules
     WHERE state = 'active' AND cohort_id IS NULL AND next_run_at <= coalesce(:now::timestamptz, now())
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id))
    + (SELECT count(*) FROM schedule_cohorts c JOIN schedules s ON s.cohort_id = c.cohort_id
       WHERE s.state = 'active' AND c.next_run_at <= coalesce(:now::timestamptz, now())
         AND (:tenant_id::text IS NULL OR c.tenant_id = :tenant_id)) AS due_schedules,
    (SELECT count(*) FROM outbox
     WHERE sent_at IS NULL AND discarded_at IS NULL AND available_at <= coalesce(:now::timestamptz, now())
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS outbox_due,
    (SELECT extract(epoch FROM coalesce(:now::timestamptz, now()) - min(available_at)) FROM outbox
     WHERE sent_at IS NULL AND discarded_at IS NULL AND available_at <= coalesce(:now::timestamptz, now())
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS queue_age_s,
    (SELECT count(*) FROM outbox
     WHERE sent_at IS NULL AND discarded_at IS NULL AND claim_expires_at = 'infinity'
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS overlap_held,
    (SELECT count(*) FROM occurrences WHERE state = 'RUNNING'
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS running,
    (SELECT count(*) FROM occurrences WHERE state = 'RETRY_WAIT'
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS retry_wait,
    (SELECT count(*) FROM occurrences WHERE state = 'DEAD'
       AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)) AS dead;
