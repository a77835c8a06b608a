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
-- lowers it.
CREATE TABLE consumers_behind (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    behind_until timestamptz NOT NULL,
    announced_at timestamptz NOT NULL
);

-- True while an attempt processor's announcement lasts, but not once the oldest unsettled log entry was
-- acknowledged more than max_defer_s before `at`: a backlog that never ends never starves the settle pass.
-- Two index probes.
CREATE FUNCTION chronoq_consumers_behind(max_defer_s float8, at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT coalesce(
    EXISTS (SELECT 1 FROM public.consumers_behind WHERE behind_until > at)
    AND (SELECT acked_at FROM public.dispatch_log WHERE settled_at IS NULL ORDER BY id LIMIT 1)
        > at - make_interval(secs => max_defer_s),
    false)
$$;
