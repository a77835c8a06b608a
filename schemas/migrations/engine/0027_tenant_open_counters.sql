-- chronoq engine, migration 0027: a tenant's open occurrences are a counter, not a count.
--
-- The tenant gate (engine/loops/tenant_gate.py) asked, on every materializer pass, how many more of a
-- tenant's first deliveries may be admitted: max_running minus its open occurrences (SCHEDULED, ENQUEUED,
-- RUNNING, RETRY_WAIT), counted through the partial index occurrences_tenant_open up to max_running. A tenant
-- whose max_running fits its burst (the hour-top's big tenant: 450,000 open) had its whole open set counted
-- on every pass of every node: 2.4 s of a 14 s materialization of 500,000, ~5 µs per occurrence and growing
-- with the burst (docs/benchmarks.md, stops 47 and 48). Now the count is kept like the quota usage
-- (migration 0024), in the same tables:
--
-- * tenant_usage.open_occurrences is the count as of the tenant's last fold; tenant_usage_changes rows carry
--   what changed since. Statement-level triggers on occurrences append one row per tenant per statement
--   that changed how many of its occurrences are open (transition tables: a materializer pass of 2,000
--   logs one row per tenant; a settle or a `started` batch, open to open, logs nothing). Every writer is
--   covered without knowing about the counter: the materializer, the relays' settle, the attempt
--   processor, the reaper, cancels and discards, requested runs, the prune and an operator's SQL.
-- * The folds of migration 0024 (a create's quota check, the periodic tenant-usage loop) fold these rows
--   too; the gate reads the counter plus the unfolded rows, in one statement (one snapshot).
-- * occurrences_tenant_open served only that count: dropped, one index entry fewer per occurrence written
--   and per open-state update.
-- * Moving a day to the archive (chronoq_archive_day) re-inserts the day's open occurrences into the hot
--   table after detaching its partition; the delete from the detached partition fires no trigger of the
--   parent, so the wrapper below takes back what the re-insert counted.
-- * What bypasses triggers (session_replication_role = replica, a restore with --disable-triggers, DML on a
--   partition itself) makes the counter drift; `chronoq tenant usage NAME --recount` repairs it.
ALTER TABLE tenant_usage ADD COLUMN open_occurrences bigint NOT NULL DEFAULT 0;
ALTER TABLE tenant_usage_changes ADD COLUMN open_occurrences bigint NOT NULL DEFAULT 0;
ALTER TABLE tenant_usage_changes ALTER COLUMN schedules SET DEFAULT 0;
ALTER TABLE tenant_usage_changes ALTER COLUMN fires_per_minute SET DEFAULT 0;

-- No occurrence changes between the count below and the triggers taking over.
LOCK TABLE occurrences IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO tenant_usage AS u (tenant_id, open_occurrences)
SELECT tenant_id, count(*)
FROM occurrences
WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
GROUP BY tenant_id
ON CONFLICT (tenant_id) DO UPDATE SET open_occurrences = excluded.open_occurrences;

-- An insert adds its open rows per tenant, a delete takes them away (both triggers name their transition
-- table written_occurrences).
CREATE FUNCTION chronoq_log_open_of_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_changes (tenant_id, open_occurrences)
    SELECT tenant_id, CASE TG_OP WHEN 'DELETE' THEN -count(*) ELSE count(*) END
    FROM written_occurrences
    WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
    GROUP BY tenant_id;
    RETURN NULL;
END
$$;

-- An update logs per tenant the open rows after minus the open rows before (a tenant change moves one
-- between tenants); nothing when that is zero, as for every open-to-open step.
CREATE FUNCTION chronoq_log_open_of_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_changes (tenant_id, open_occurrences)
    SELECT tenant_id, sum(change)
    FROM (SELECT tenant_id, 1 AS change FROM new_occurrences
          WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
          UNION ALL
          SELECT tenant_id, -1 FROM old_occurrences
          WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')) c
    GROUP BY tenant_id
    HAVING sum(change) <> 0;
    RETURN NULL;
END
$$;

-- TRUNCATE leaves no tenant anything open (no row triggers fire for it).
CREATE FUNCTION chronoq_clear_open() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_usage_changes WHERE open_occurrences <> 0;
    UPDATE tenant_usage SET open_occurrences = 0 WHERE open_occurrences <> 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER occurrences_open_of_truncated AFTER TRUNCATE ON occurrences
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_clear_open();

CREATE TRIGGER occurrences_open_of_inserted AFTER INSERT ON occurrences
    REFERENCING NEW TABLE AS written_occurrences
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_log_open_of_written();

CREATE TRIGGER occurrences_open_of_deleted AFTER DELETE ON occurrences
    REFERENCING OLD TABLE AS written_occurrences
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_log_open_of_written();

CREATE TRIGGER occurrences_open_of_updated AFTER UPDATE ON occurrences
    REFERENCING OLD TABLE AS old_occurrences NEW TABLE AS new_occurrences
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_log_open_of_updated();

DROP INDEX occurrences_tenant_open;

-- A tenant's open occurrences now: its counter plus its unfolded changes, in the caller's snapshot (what
-- the tenant gate admits against max_running; schemas/queries/tenant_gate.sql).
CREATE FUNCTION chronoq_open_occurrences(tenant text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT (coalesce((SELECT u.open_occurrences FROM tenant_usage u WHERE u.tenant_id = tenant), 0)
            + coalesce((SELECT sum(l.open_occurrences) FROM tenant_usage_changes l WHERE l.tenant_id = tenant), 0)
           )::bigint
$$;

-- Moving a day to the archive, counted: migration 0016's function does the move; the day's occurrences it
-- keeps hot are re-inserted into public.occurrences (counted again by the insert trigger) after being
-- deleted from the detached partition (which fires none of the parent's triggers). They are the only rows
-- of that day in the DEFAULT partition when it returns (the day was attached before; the move holds the
-- parent exclusively until commit), so their open ones are taken back here, in the same transaction.
ALTER FUNCTION chronoq_archive_day(date, bigint, timestamptz) RENAME TO chronoq_archive_day_uncounted;

CREATE FUNCTION chronoq_archive_day(day date, default_keep_s bigint, now timestamptz)
RETURNS TABLE (occurrences bigint, attempts bigint, kept bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT m.occurrences, m.attempts, m.kept
                 FROM chronoq_archive_day_uncounted(day, default_keep_s, now) m;
    INSERT INTO tenant_usage_changes (tenant_id, open_occurrences)
    SELECT o.tenant_id, -count(*)
    FROM public.occurrences_default o
    WHERE o.scheduled_for >= day::timestamp AT TIME ZONE 'UTC'
      AND o.scheduled_for < (day + 1)::timestamp AT TIME ZONE 'UTC'
      AND o.state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT')
    GROUP BY o.tenant_id;
END
$$;
