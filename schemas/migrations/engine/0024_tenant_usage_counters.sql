-- chronoq engine, migration 0024: a tenant's quota usage is a counter, not a count of its schedules.
--
-- The quota check of every create and update counted the tenant's live (active or paused) schedules and
-- summed their trigger rates, under the tenant's row lock: ~0.35 µs per live schedule, 40 ms per create at
-- 100,000, a third of a second at a million, and one tenant's creates serialized behind it
-- (docs/benchmarks.md, stop 42). Now:
--
-- * tenant_usage holds each tenant's count and rate sum as of its last fold; tenant_usage_changes logs
--   what changed since, appended by triggers on schedules. Every writer of a schedule is covered (the API,
--   batches, the command processor, an operator's SQL) without each statement knowing about the counter;
--   the one exception, the materializer's completions, is below.
-- * Appending, not updating, is what keeps the writers apart: the materializer completes schedules of many
--   tenants in one statement on two nodes at once, and a counter row updated in place would serialize their
--   passes on the big tenant's row and could deadlock them against a create (row lock on the schedule,
--   then the counter, in the other order). Inserts take no lock another writer waits for.
-- * The quota check of a create, an update or a batch (query tenant_usage) folds the tenant's logged
--   changes into its counter and reads it, under the tenant's row lock, so folds of one tenant never
--   interleave. A change committed after the fold's snapshot stays for the next fold (DELETE only takes
--   the rows it sees). Readers that only display usage add the unfolded changes to the counter instead.
-- * The rate sum is numeric: float8 rates converted exactly as the same decimal each time, so adding and
--   later removing one schedule's rate leaves the sum as it was (float8 sums would drift).
-- * Inserts and deletes log one row per tenant per statement (transition tables: a batch create of 1,000
--   logs one row); updates log per row, and only when liveness, rate or tenant changed (the WHEN clause),
--   so the materializer's cursor advance, which changes none of them, logs and calls nothing.
-- * Except active → completed: only the materializer's statement completes a schedule (a one-time one
--   fired, a run limit reached), and it logs its completions itself, one row per tenant (queries
--   materializer.sql, materialize_staged). A trigger call per completion cost 5-9 µs of a ~55 µs row in a
--   burst of one-time schedules (docs/benchmarks.md, stop 44). An operator's SQL that completes a schedule
--   is not logged: `chronoq tenant usage --recount` repairs that, as for any write that bypasses triggers.
CREATE TABLE tenant_usage (
    tenant_id        text PRIMARY KEY,
    schedules        bigint NOT NULL DEFAULT 0,
    fires_per_minute numeric NOT NULL DEFAULT 0
);

CREATE TABLE tenant_usage_changes (
    tenant_id        text NOT NULL,
    schedules        bigint NOT NULL,
    fires_per_minute numeric NOT NULL
);
CREATE INDEX tenant_usage_changes_tenant ON tenant_usage_changes (tenant_id);

-- No schedule changes between the count below and the triggers taking over.
LOCK TABLE schedules IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO tenant_usage (tenant_id, schedules, fires_per_minute)
SELECT tenant_id, count(*), coalesce(sum(fires_per_minute::numeric), 0)
FROM schedules
WHERE state IN ('active', 'paused')
GROUP BY tenant_id;

CREATE FUNCTION chronoq_log_usage_of_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_changes (tenant_id, schedules, fires_per_minute)
    SELECT tenant_id, count(*), sum(fires_per_minute::numeric)
    FROM inserted_schedules
    WHERE state IN ('active', 'paused')
    GROUP BY tenant_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION chronoq_log_usage_of_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_usage_changes (tenant_id, schedules, fires_per_minute)
    SELECT tenant_id, -count(*), -sum(fires_per_minute::numeric)
    FROM deleted_schedules
    WHERE state IN ('active', 'paused')
    GROUP BY tenant_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION chronoq_log_usage_of_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('active', 'paused') THEN
        INSERT INTO tenant_usage_changes (tenant_id, schedules, fires_per_minute)
        VALUES (OLD.tenant_id, -1, -OLD.fires_per_minute::numeric);
    END IF;
    IF NEW.state IN ('active', 'paused') THEN
        INSERT INTO tenant_usage_changes (tenant_id, schedules, fires_per_minute)
        VALUES (NEW.tenant_id, 1, NEW.fires_per_minute::numeric);
    END IF;
    RETURN NULL;
END
$$;

-- TRUNCATE empties every tenant's usage (no row triggers fire for it).
CREATE FUNCTION chronoq_clear_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_usage_changes;
    DELETE FROM tenant_usage;
    RETURN NULL;
END
$$;

CREATE TRIGGER schedules_usage_of_truncated AFTER TRUNCATE ON schedules
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_clear_usage();

CREATE TRIGGER schedules_usage_of_inserted AFTER INSERT ON schedules
    REFERENCING NEW TABLE AS inserted_schedules
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_log_usage_of_inserted();

CREATE TRIGGER schedules_usage_of_deleted AFTER DELETE ON schedules
    REFERENCING OLD TABLE AS deleted_schedules
    FOR EACH STATEMENT EXECUTE FUNCTION chronoq_log_usage_of_deleted();

CREATE TRIGGER schedules_usage_of_updated AFTER UPDATE OF state, fires_per_minute, tenant_id ON schedules
    FOR EACH ROW
    WHEN ((OLD.state IN ('active', 'paused'),
           CASE WHEN OLD.state IN ('active', 'paused') THEN OLD.fires_per_minute END,
           OLD.tenant_id)
          IS DISTINCT FROM
          (NEW.state IN ('active', 'paused'),
           CASE WHEN NEW.state IN ('active', 'paused') THEN NEW.fires_per_minute END,
           NEW.tenant_id)
          AND NOT (OLD.state = 'active' AND NEW.state = 'completed' AND OLD.tenant_id = NEW.tenant_id))
    EXECUTE FUNCTION chronoq_log_usage_of_updated();
