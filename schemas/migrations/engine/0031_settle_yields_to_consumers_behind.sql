-- chronoq engine, migration 0031 (after 0030): the settle pass also waits while consumers work through a backlog.
--
-- The settle pass records ENQUEUED and enqueued_at for what the ahead-lane relays published (one UPDATE of
-- the wide occurrence row each). It already waits while a burst is being dispatched (0021). After a
-- 500,000 burst the consumers then take minutes to start it all on this machine, and the settle pass's
-- updates ran among them: 41 % of PostgreSQL's statement time in the first 25 s, its locks in the attempt
-- processor's way. Held off until the consumers are through, the consumer side starts the burst ~10 % sooner
-- at the same machine speed (handler start p99, docs/benchmarks.md, stop 55). Nothing reads the
-- settled state in the meantime that cannot read the log instead: the API shows a published occurrence as
-- ENQUEUED with its page's acknowledgement (engine/control/schedules.py, _as_published), and the attempt
-- processor moves a SCHEDULED occurrence a consumer started as it moves an ENQUEUED one.
--
-- The attempt processor says when consumers are behind: it applied many starts and outcomes of attempts that
-- started seconds after their occurrences became available (engine/rules/consumers_behind.py), and writes
-- until when here, rewritten while it lasts. One row for the whole database: every processor raises it, none
-- lowers it. The settle pass asks one rule, chronoq_settle_waits: 0021's or this one.
CREATE TABLE consumers_behind (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    behind_until timestamptz NOT NULL,
    announced_at timestamptz NOT NULL
);

-- Whether the oldest unsettled log entry was acknowledged less than max_s before `at` (NULL: nothing is
-- unsettled). Both arms of the deferral rule are bounded by it, each with its own limit. One index probe.
CREATE FUNCTION chronoq_oldest_unsettled_within(max_s float8, at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT (SELECT acked_at FROM public.dispatch_log WHERE settled_at IS NULL ORDER BY id LIMIT 1)
       > at - make_interval(secs => max_s)
$$;

-- True while an attempt processor's announcement lasts, but not once the oldest unsettled log entry was
-- acknowledged more than max_defer_s before `at`: a backlog that never ends never starves the settle pass.
CREATE FUNCTION chronoq_consumers_behind(max_defer_s float8, at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT coalesce(
    EXISTS (SELECT 1 FROM public.consumers_behind WHERE behind_until > at)
    AND chronoq_oldest_unsettled_within(max_defer_s, at),
    false)
$$;

-- 0021's rule, the same, its bound now the shared function.
CREATE OR REPLACE FUNCTION chronoq_settle_deferred(
    busy_here boolean, busy_s float8, busy_rows bigint, busy_entries integer, max_defer_s float8, at timestamptz
) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT coalesce(
    (busy_here
     OR EXISTS (SELECT 1 FROM public.engine_nodes
                WHERE handing_over_until > at AND expires_at > at)
     OR (SELECT acked_at FROM public.dispatch_log ORDER BY id DESC LIMIT 1) > at - make_interval(secs => busy_s)
     OR (SELECT coalesce(sum(r.rows), 0)
         FROM (SELECT rows, logged_at FROM public.dispatch_log ORDER BY id DESC LIMIT busy_entries) r
         WHERE r.logged_at > at - make_interval(secs => busy_s)) >= busy_rows)
    AND chronoq_oldest_unsettled_within(max_defer_s, at),
    false)
$$;

-- The settle pass's whole deferral rule, which the settle statement and the read-only check both ask (as 0021
-- made one function of the first so that the two cannot drift apart): a burst is being dispatched, or
-- consumers are working through one.
CREATE FUNCTION chronoq_settle_waits(
    busy_here boolean, busy_s float8, busy_rows bigint, busy_entries integer, max_defer_s float8,
    max_defer_behind_s float8, at timestamptz
) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT chronoq_settle_deferred(busy_here, busy_s, busy_rows, busy_entries, max_defer_s, at)
       OR chronoq_consumers_behind(max_defer_behind_s, at)
$$;
