-- chronoq engine, migration 0030: attempt rows keep room on their page for their second version.
--
-- An attempt row is written twice: inserted at `started`, updated at its outcome (and at each heartbeat).
-- The update changes no indexed column (the key (attempt_id, scheduled_for) and (occurrence_id,
-- attempt_number)), so PostgreSQL can make it HOT: a new version on the same page, no index entry. Only on
-- the same page, though, and at the default fillfactor (100) a burst's inserts fill each page, so nearly
-- every outcome moved its row to another page and wrote an entry into both indexes. With half of each page
-- kept free, 89 % of a 100,000 burst's outcomes were HOT and the outcome's update cost 65 % less, with 29 %
-- of its WAL (load_tests.consumer_burst, docs/benchmarks.md stop 54). The price: the hot attempt
-- partitions take about twice the pages until their day moves to the archive (docs/capacity.md).
--
-- Partitions do not inherit storage parameters (CREATE TABLE ... LIKE copies none), so the default
-- partition and every existing day partition are set here, and chronoq_ensure_day_partitions now sets each
-- new day partition of attempts as it creates it.

-- chronoq_half_fill_attempt_partitions(): every partition of public.attempts keeps half of each page free
-- (fillfactor 50); returns how many were changed. Only partitions not already so are altered (SHARE UPDATE
-- EXCLUSIVE: readers and writers go on; the setting applies to pages filled from now on).
CREATE FUNCTION chronoq_half_fill_attempt_partitions() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    setting constant text := 'fillfactor=50';  -- as pg_class.reloptions spells it, and as ALTER TABLE takes it
    part regclass;
    changed integer := 0;
BEGIN
    FOR part IN
        SELECT i.inhrelid::regclass
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.attempts'::regclass
          AND NOT coalesce(c.reloptions @> ARRAY[setting], false)
    LOOP
        EXECUTE format('ALTER TABLE %s SET (%s)', part, setting);
        changed := changed + 1;
    END LOOP;
    RETURN changed;
END
$$;

SELECT chronoq_half_fill_attempt_partitions();

-- The partition creator as before (0016), then its new attempts partitions half filled, in one transaction.
ALTER FUNCTION chronoq_ensure_day_partitions(date, date) RENAME TO chronoq_ensure_day_partitions_as_created;

CREATE FUNCTION chronoq_ensure_day_partitions(from_day date, to_day date) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    created integer;
BEGIN
    created := chronoq_ensure_day_partitions_as_created(from_day, to_day);
    PERFORM chronoq_half_fill_attempt_partitions();
    RETURN created;
END
$$;
