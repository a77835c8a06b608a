-- chronoq engine, migration 0021 (after the hand-over announcements, 0020): the settle pass's deferral rule
-- as one function, so that the settle statement itself can ask it.
--
-- The settle pass asked "is a burst being dispatched?" (settle_deferred) and then, in another statement,
-- settled. In a burst the two were seconds apart: a check passed just before the top, and its settle
-- statement ran at +2.44 s, after waiting for the node's event loop and pool, while both nodes' announcements
-- were valid (8,192 rows of a 500,000 burst settled inside it; docs/benchmarks.md, stops 36 and 37). Now the
-- settle statement evaluates this rule in its own snapshot and settles nothing when it says wait; the
-- read-only check (settle_deferred) calls the same function, so the two cannot drift apart.
--
-- True while a burst is being dispatched, but not once the oldest unsettled entry was acknowledged more
-- than max_defer_s before `at` (steady dispatch never starves the settle pass). A burst is being dispatched
-- when the asking node's relay is handing one over (busy_here: it counts its own hand-overs, which the log
-- shows only seconds later), a live node announced that its relay is (engine_nodes.handing_over_until,
-- migration 0020), some relay had a page acknowledged within the last busy_s seconds, or relays logged
-- busy_rows rows or more within them (logged_at, migration 0018, among the newest busy_entries entries): a
-- relay handing a burst over logs its pages a second or more after their acknowledgements. Index probes and
-- a bounded scan of the newest entries.
CREATE FUNCTION chronoq_settle_deferred(
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
    AND (SELECT acked_at FROM public.dispatch_log WHERE settled_at IS NULL ORDER BY id LIMIT 1)
        > at - make_interval(secs => max_defer_s),
    false)
$$;
