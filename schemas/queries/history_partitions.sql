-- Day partitions of the history tables (migration 0016): created ahead by the engine, moved to the archive
-- by the prune. The DDL itself is in the migration's functions (names built with format(%I), never here).

-- name: ensure_day_partitions
-- Creates the missing day partitions of occurrences and attempts for the UTC days :from_day .. :to_day;
-- how many tables were created.
SELECT chronoq_ensure_day_partitions(:from_day::date, :to_day::date) AS created;

-- name: hot_day_partitions
-- The day partitions attached to public.occurrences, oldest first, with the day each holds.
SELECT c.relname AS partition, to_date(substring(c.relname FROM '_p([0-9]{8})$'), 'YYYYMMDD') AS day
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'public.occurrences'::regclass AND c.relname ~ '^occurrences_p[0-9]{8}$'
ORDER BY day;

-- name: day_partition_rows
-- How many occurrences and attempts the day partitions of :day hold (a dry run's "would move").
SELECT (SELECT count(*) FROM occurrences WHERE scheduled_for >= :day::date::timestamp AT TIME ZONE 'UTC'
          AND scheduled_for < (:day::date + 1)::timestamp AT TIME ZONE 'UTC') AS occurrences,
       (SELECT count(*) FROM attempts WHERE scheduled_for >= :day::date::timestamp AT TIME ZONE 'UTC'
          AND scheduled_for < (:day::date + 1)::timestamp AT TIME ZONE 'UTC') AS attempts;

-- name: day_partition_kept
-- What would stay hot if day :day moved now (by state, with their attempts), under the default retention
-- :default_keep_s.
SELECT k.state, count(*) AS occurrences,
       coalesce(sum((SELECT count(*) FROM attempts a WHERE a.occurrence_id = k.occurrence_id
                     AND a.scheduled_for >= :day::date::timestamp AT TIME ZONE 'UTC'
                     AND a.scheduled_for < (:day::date + 1)::timestamp AT TIME ZONE 'UTC')), 0)::bigint AS attempts
FROM chronoq_day_kept_hot(format('public.occurrences_p%s', to_char(:day::date, 'YYYYMMDD'))::regclass,
                          :default_keep_s, coalesce(:now::timestamptz, now())) k
GROUP BY k.state ORDER BY k.state;

-- name: archive_day
-- Moves day :day of occurrences and attempts into the archive (see chronoq_archive_day in migration 0016).
SELECT occurrences, attempts, kept
FROM chronoq_archive_day(:day::date, :default_keep_s, coalesce(:now::timestamptz, now()));
