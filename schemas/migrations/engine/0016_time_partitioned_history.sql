-- Time-partitioned history (issue 17): occurrences and attempts, hot and archived, are partitioned by
-- RANGE (scheduled_for), one partition per UTC day, so that retention moves a whole day with DDL (no
-- per-row WAL, no dead tuples) and the hot queries that name an instant read one day's indexes.
--
-- What this migration does, and why:
--
-- * Each of public.occurrences, public.attempts, archive.occurrences, archive.attempts becomes a
--   partitioned table with only a DEFAULT partition. Existing rows are copied into it. Day partitions are
--   created ahead by the engine (chronoq_ensure_day_partitions, called by engine/loops/history_partitions.py),
--   never here: a migration that created "today" would build a different schema on every day, and the
--   snapshot in schemas/snapshots/ must not depend on the date. Rows of old days stay in the DEFAULT
--   partition until the batch prune moves them (docs/capacity.md, "Migrating an existing database").
--
-- * attempts gets scheduled_for (its occurrence's), the partition key, so that an occurrence and its
--   attempts always live in the same day and leave together.
--
-- * Primary keys include the partition key (PostgreSQL requires it): occurrences (occurrence_id,
--   scheduled_for), attempts (attempt_id, scheduled_for), lease tokens (lease_token, scheduled_for). For a
--   schedule's slot occurrence_id is uuid5(schedule, version, scheduled_for), and a manual or backfilled id
--   is minted once with its instant, so the pair is as unique as the id was. The slot uniqueness
--   (schedule_id, schedule_version, scheduled_for) already contained the key and is unchanged.
--
-- * The three foreign keys to occurrences (from attempts, outbox, stuck_occurrences) are dropped. A foreign
--   key to a partitioned table must name its whole key (the outbox's scheduled_for is a retry's due instant,
--   not the occurrence's), and it would forbid what retention does: detaching a day and moving its few
--   not-final rows back through the DEFAULT partition. Integrity is kept by the writers: every statement
--   that inserts an attempt, an outbox row or a stuck watch holds its occurrence locked (FOR UPDATE) or
--   inserts it in the same statement, and the prune moves an occurrence with its attempts in one
--   transaction. tests/integration/test_history_partitions.py checks the orphan count after a retention run.
--
-- * The BRIN index on scheduled_for is gone: partition pruning does its work.
ALTER TABLE attempts DROP CONSTRAINT attempts_occurrence_id_fkey;
ALTER TABLE outbox DROP CONSTRAINT outbox_occurrence_id_fkey;
ALTER TABLE stuck_occurrences DROP CONSTRAINT stuck_occurrences_occurrence_id_fkey;

-- public.occurrences
ALTER TABLE occurrences RENAME TO occurrences_unpartitioned;
CREATE TABLE occurrences (LIKE occurrences_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (scheduled_for);
CREATE TABLE occurrences_default PARTITION OF occurrences DEFAULT;
INSERT INTO occurrences SELECT * FROM occurrences_unpartitioned;
DROP TABLE occurrences_unpartitioned;
ALTER TABLE occurrences ADD CONSTRAINT occurrences_pkey PRIMARY KEY (occurrence_id, scheduled_for);
ALTER TABLE occurrences ADD CONSTRAINT occurrences_schedule_id_fkey
    FOREIGN KEY (schedule_id) REFERENCES schedules (schedule_id);
CREATE INDEX occurrences_dead ON occurrences (tenant_id, finished_at, occurrence_id) WHERE state = 'DEAD';
CREATE INDEX occurrences_enqueued_since ON occurrences (updated_at) WHERE state = 'ENQUEUED';
CREATE INDEX occurrences_lease_expiry ON occurrences (lease_expires_at) WHERE state = 'RUNNING';
CREATE INDEX occurrences_open ON occurrences (schedule_id)
    WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT');
CREATE INDEX occurrences_schedule ON occurrences (schedule_id, scheduled_for);
CREATE UNIQUE INDEX occurrences_slot ON occurrences (schedule_id, schedule_version, scheduled_for)
    WHERE origin <> 'manual';
CREATE UNIQUE INDEX occurrences_slot_holder ON occurrences (schedule_id, scheduled_for)
    WHERE slot_released_at IS NULL AND origin <> 'manual';
CREATE INDEX occurrences_tenant_open ON occurrences (tenant_id)
    WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT');
CREATE INDEX occurrences_tenant_time ON occurrences (tenant_id, scheduled_for);

-- public.attempts (scheduled_for added last, so the archive's LIKE copy keeps the same column order)
ALTER TABLE attempts RENAME TO attempts_unpartitioned;
CREATE TABLE attempts (LIKE attempts_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                       scheduled_for timestamptz NOT NULL)
    PARTITION BY RANGE (scheduled_for);
CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;
-- An attempt whose occurrence is gone (impossible under the old foreign key) keeps its start as its day.
INSERT INTO attempts
SELECT a.*, coalesce(o.scheduled_for, a.started_at)
FROM attempts_unpartitioned a LEFT JOIN occurrences o ON o.occurrence_id = a.occurrence_id;
DROP TABLE attempts_unpartitioned;
ALTER TABLE attempts ADD CONSTRAINT attempts_pkey PRIMARY KEY (attempt_id, scheduled_for);
ALTER TABLE attempts ADD CONSTRAINT attempts_lease_token_key UNIQUE (lease_token, scheduled_for);
CREATE INDEX attempts_occurrence ON attempts (occurrence_id, attempt_number);

-- archive.occurrences and archive.attempts: the same layout, with the archive's three indexes.
ALTER TABLE archive.occurrences RENAME TO occurrences_unpartitioned;
CREATE TABLE archive.occurrences (LIKE archive.occurrences_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (scheduled_for);
CREATE TABLE archive.occurrences_default PARTITION OF archive.occurrences DEFAULT;
INSERT INTO archive.occurrences SELECT * FROM archive.occurrences_unpartitioned;
DROP TABLE archive.occurrences_unpartitioned;
ALTER TABLE archive.occurrences ADD CONSTRAINT occurrences_pkey PRIMARY KEY (occurrence_id, scheduled_for);
CREATE INDEX occurrences_schedule ON archive.occurrences (schedule_id, scheduled_for);
CREATE INDEX occurrences_tenant_time ON archive.occurrences (tenant_id, scheduled_for);

ALTER TABLE archive.attempts RENAME TO attempts_unpartitioned;
CREATE TABLE archive.attempts (LIKE archive.attempts_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                               scheduled_for timestamptz NOT NULL)
    PARTITION BY RANGE (scheduled_for);
CREATE TABLE archive.attempts_default PARTITION OF archive.attempts DEFAULT;
INSERT INTO archive.attempts
SELECT a.*, coalesce(o.scheduled_for, a.started_at)
FROM archive.attempts_unpartitioned a LEFT JOIN archive.occurrences o ON o.occurrence_id = a.occurrence_id;
DROP TABLE archive.attempts_unpartitioned;
ALTER TABLE archive.attempts ADD CONSTRAINT attempts_pkey PRIMARY KEY (attempt_id, scheduled_for);
CREATE INDEX attempts_occurrence ON archive.attempts (occurrence_id, attempt_number);

-- The archive horizon of every tenant at once: a day partition moved to the archive holds every tenant's
-- finished occurrences of that day (tenant '*'; the reconciler reads it beside the tenant's own row).
ALTER TABLE archive.horizons ADD CONSTRAINT horizons_tenant_check CHECK (tenant_id = '*' OR tenant_id <> '');

-- chronoq_ensure_day_partitions(from_day, to_day): every UTC day in [from_day, to_day] has its partition of
-- public.occurrences and public.attempts (occurrences_pYYYYMMDD, attempts_pYYYYMMDD); returns how many were
-- created. Rows of a new day that had landed in the DEFAULT partition (a clock far off, a backfill) move
-- into it first, so a row is never refused and ATTACH never fails on them. Writers of the parent wait for
-- the few milliseconds of a creation (reads go on); lock_timeout makes a busy moment a failed pass that
-- the next pass retries, never a convoy behind this one. Safe to run concurrently (an advisory lock).
CREATE FUNCTION chronoq_ensure_day_partitions(from_day date, to_day date) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day date;
    parent text;
    part text;
    stray boolean;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('chronoq.history_partitions'));
    SET LOCAL lock_timeout = '5s';
    FOR day IN SELECT generate_series(from_day, to_day, interval '1 day')::date LOOP
        FOREACH parent IN ARRAY ARRAY['occurrences', 'attempts'] LOOP
            part := parent || '_p' || to_char(day, 'YYYYMMDD');
            -- A day already in the archive is not created again: its late rows go to the DEFAULT partition.
            CONTINUE WHEN to_regclass('public.' || part) IS NOT NULL OR to_regclass('archive.' || part) IS NOT NULL;
            -- The CHECK makes ATTACH (here, and into the archive later) skip its validation scan.
            EXECUTE format('CREATE TABLE public.%I (LIKE public.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
                           ' CONSTRAINT %I CHECK (scheduled_for >= %L AND scheduled_for < %L))',
                           part, parent, part || '_day', day::timestamp AT TIME ZONE 'UTC',
                           (day + 1)::timestamp AT TIME ZONE 'UTC');
            -- SHARE on the parent holds off writers (not readers) until this commits. Without it an INSERT
            -- that routed a row of this day to DEFAULT before the ATTACH fails after it, on DEFAULT's new
            -- constraint; writers that wait here route with the new partition once this commits.
            EXECUTE format('LOCK TABLE public.%I IN SHARE MODE', parent);
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM public.%I WHERE scheduled_for >= %L AND scheduled_for < %L)',
                           parent || '_default', day::timestamp AT TIME ZONE 'UTC',
                           (day + 1)::timestamp AT TIME ZONE 'UTC') INTO stray;
            IF stray THEN
                -- Moving rows between partitions needs readers held off too: a query planned before this
                -- commits (without the new partition) but run after it would miss the moved rows.
                EXECUTE format('LOCK TABLE public.%I IN ACCESS EXCLUSIVE MODE', parent);
                EXECUTE format('WITH moved AS (DELETE FROM public.%I WHERE scheduled_for >= %L'
                               ' AND scheduled_for < %L RETURNING *) INSERT INTO public.%I SELECT * FROM moved',
                               parent || '_default', day::timestamp AT TIME ZONE 'UTC',
                               (day + 1)::timestamp AT TIME ZONE 'UTC', part);
            END IF;
            EXECUTE format('ALTER TABLE public.%I ATTACH PARTITION public.%I FOR VALUES FROM (%L) TO (%L)',
                           parent, part, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            created := created + 1;
        END LOOP;
    END LOOP;
    RETURN created;
END
$$;

-- chronoq_day_kept_hot(partition, default_keep_s, now): the occurrences of a day partition that must stay
-- hot when the day moves to the archive (with their state): all but those prunable by their own tenant's
-- retention, i.e. final (SUCCEEDED, MISSED, CANCELED, SKIPPED_OVERLAP), scheduled before the tenant's
-- cutoff, and handed off completely (no unsent outbox row, no ahead-lane row, no open stuck watch).
-- The same rule as the batch prune (schemas/queries/history.sql); shared by the move and its dry run.
CREATE FUNCTION chronoq_day_kept_hot(part regclass, default_keep_s bigint, now timestamptz)
RETURNS TABLE (occurrence_id uuid, state text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format($q$
        SELECT o.occurrence_id, o.state FROM %s o LEFT JOIN public.tenants t ON t.tenant_id = o.tenant_id
        WHERE NOT (o.state IN ('SUCCEEDED', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')
                   AND o.scheduled_for < $1 - make_interval(secs => coalesce(t.history_keep_s, $2))
                   AND NOT EXISTS (SELECT 1 FROM public.outbox b WHERE b.occurrence_id = o.occurrence_id
                                   AND b.sent_at IS NULL AND b.discarded_at IS NULL)
                   AND NOT EXISTS (SELECT 1 FROM public.dispatch_queue q WHERE q.occurrence_id = o.occurrence_id)
                   AND NOT EXISTS (SELECT 1 FROM public.stuck_occurrences s WHERE s.occurrence_id = o.occurrence_id
                                   AND s.resolved_at IS NULL))$q$, part)
    USING now, default_keep_s;
END
$$;

-- chronoq_archive_day(day, default_keep_s, now): moves the day partitions of public.occurrences and
-- public.attempts into the archive, keeping hot what must stay hot; returns (occurrences moved, attempts
-- moved, occurrences kept hot). The caller checks that the whole day is older than the default retention.
-- In one transaction:
--   1. detach both day partitions (ACCESS EXCLUSIVE on the parents for this short transaction);
--   2. what chronoq_day_kept_hot names stays hot: those occurrences, with their attempts, are re-inserted
--      into the hot tables (they land in the DEFAULT partitions: the day is no longer attached) and deleted from the
--      detached ones;
--   3. delivered outbox rows and resolved stuck watches of the moved occurrences are deleted (their message
--      is in Kafka, the occurrence keeps the outcome), as the batch prune does;
--   4. indexes the archive does not have are dropped, the tables move to the archive schema, rows of that
--      day the batch prune had put in the archive's DEFAULT partition join them, and they are attached to
--      archive.occurrences / archive.attempts;
--   5. the archive horizon of every tenant ('*') moves to the day's end.
-- Killed anywhere, the transaction rolls back: the day is attached where it was, nothing lost or doubled.
CREATE FUNCTION chronoq_archive_day(day date, default_keep_s bigint, now timestamptz)
RETURNS TABLE (occurrences bigint, attempts bigint, kept bigint)
LANGUAGE plpgsql AS $$
DECLARE
    lower_bound timestamptz := day::timestamp AT TIME ZONE 'UTC';
    upper_bound timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
    occ text := 'occurrences_p' || to_char(day, 'YYYYMMDD');
    att text := 'attempts_p' || to_char(day, 'YYYYMMDD');
    ix record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('chronoq.history_partitions'));
    SET LOCAL lock_timeout = '5s';
    IF to_regclass('public.' || occ) IS NULL OR to_regclass('public.' || att) IS NULL THEN
        RAISE EXCEPTION 'no day partitions % / % to archive', occ, att;
    END IF;
    -- The archive's parents too: rows move out of its DEFAULT partition below, and a reader planned
    -- before this commits but run after it would miss them.
    LOCK TABLE archive.occurrences, archive.attempts IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('ALTER TABLE public.occurrences DETACH PARTITION public.%I', occ);
    EXECUTE format('ALTER TABLE public.attempts DETACH PARTITION public.%I', att);

    DROP TABLE IF EXISTS chronoq_kept;
    CREATE TEMPORARY TABLE chronoq_kept ON COMMIT DROP AS
    SELECT k.occurrence_id FROM chronoq_day_kept_hot(format('public.%I', occ)::regclass, default_keep_s, now) k;
    EXECUTE format('WITH moved AS (DELETE FROM public.%I WHERE occurrence_id IN (SELECT occurrence_id FROM chronoq_kept)'
                   ' RETURNING *) INSERT INTO public.attempts SELECT * FROM moved', att);
    EXECUTE format('WITH moved AS (DELETE FROM public.%I WHERE occurrence_id IN (SELECT occurrence_id FROM chronoq_kept)'
                   ' RETURNING *) INSERT INTO public.occurrences SELECT * FROM moved', occ);
    kept := (SELECT count(*) FROM chronoq_kept);

    EXECUTE format('DELETE FROM public.outbox b USING public.%I o WHERE b.occurrence_id = o.occurrence_id', occ);
    EXECUTE format('DELETE FROM public.stuck_occurrences s USING public.%I o WHERE s.occurrence_id = o.occurrence_id',
                   occ);

    -- Keep the primary key and the indexes the archive's parent has (same columns, no predicate); the rest
    -- (the hot tables' partial indexes on states) serve no archive reader.
    EXECUTE format('SELECT count(*) FROM public.%I', occ) INTO occurrences;
    EXECUTE format('SELECT count(*) FROM public.%I', att) INTO attempts;
    FOR ix IN
        SELECT c.relname, i.indrelid::regclass AS tab, k.conname
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = i.indrelid
        WHERE i.indrelid IN (format('public.%I', occ)::regclass, format('public.%I', att)::regclass)
          AND NOT i.indisprimary
          AND (i.indpred IS NOT NULL OR NOT EXISTS (
                SELECT 1 FROM pg_index p
                WHERE p.indrelid IN ('archive.occurrences'::regclass, 'archive.attempts'::regclass)
                  AND p.indkey::text = i.indkey::text AND p.indpred IS NULL
                  AND (SELECT c2.relname FROM pg_class c2 WHERE c2.oid = p.indrelid)
                      = CASE WHEN i.indrelid = format('public.%I', occ)::regclass THEN 'occurrences' ELSE 'attempts' END))
    LOOP
        IF ix.conname IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', ix.tab, ix.conname);
        ELSE
            EXECUTE format('DROP INDEX public.%I', ix.relname);
        END IF;
    END LOOP;
    EXECUTE format('ALTER TABLE public.%I SET SCHEMA archive', occ);
    EXECUTE format('ALTER TABLE public.%I SET SCHEMA archive', att);
    EXECUTE format('WITH moved AS (DELETE FROM archive.occurrences_default WHERE scheduled_for >= %L'
                   ' AND scheduled_for < %L RETURNING *) INSERT INTO archive.%I SELECT * FROM moved',
                   lower_bound, upper_bound, occ);
    EXECUTE format('WITH moved AS (DELETE FROM archive.attempts_default WHERE scheduled_for >= %L'
                   ' AND scheduled_for < %L RETURNING *) INSERT INTO archive.%I SELECT * FROM moved',
                   lower_bound, upper_bound, att);
    EXECUTE format('ALTER TABLE archive.occurrences ATTACH PARTITION archive.%I FOR VALUES FROM (%L) TO (%L)',
                   occ, lower_bound, upper_bound);
    EXECUTE format('ALTER TABLE archive.attempts ATTACH PARTITION archive.%I FOR VALUES FROM (%L) TO (%L)',
                   att, lower_bound, upper_bound);

    INSERT INTO archive.horizons (tenant_id, archived_before, updated_at) VALUES ('*', upper_bound, now)
    ON CONFLICT (tenant_id) DO UPDATE
    SET archived_before = greatest(archive.horizons.archived_before, excluded.archived_before),
        updated_at = excluded.updated_at;
    RETURN NEXT;
END
$$;
