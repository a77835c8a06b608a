-- History retention (issue 17): finished occurrences older than the policy move, with their attempts,
-- from the hot tables into the archive schema of the same database, in bounded batches
-- (schemas/queries/history.sql, engine/control/history_retention.py).
--
-- Why an archive schema in the same database rather than files: each batch moves its rows with one
-- transaction (INSERT into archive + DELETE from hot), so a pruner killed at any point loses nothing and
-- doubles nothing, with no export/confirm protocol between two stores; readers (schedule occurrences,
-- the reconciler) read hot UNION ALL archive with one SQL statement. The archive carries only the
-- indexes its readers need (three instead of eight on occurrences), can be placed on a cheaper
-- tablespace, and can later be exported and truncated per day.
--
-- The archive tables have exactly the hot tables' columns, in the same order (LIKE): readers union
-- ``SELECT *`` of both. A migration that adds a column to occurrences or attempts adds it here too
-- (tests/integration/test_history_retention.py checks the two column lists are equal).
CREATE SCHEMA archive;

CREATE TABLE archive.occurrences (LIKE public.occurrences INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE archive.occurrences ADD PRIMARY KEY (occurrence_id);
CREATE INDEX occurrences_schedule ON archive.occurrences (schedule_id, scheduled_for);
CREATE INDEX occurrences_tenant_time ON archive.occurrences (tenant_id, scheduled_for);

CREATE TABLE archive.attempts (LIKE public.attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE archive.attempts ADD PRIMARY KEY (attempt_id);
CREATE INDEX attempts_occurrence ON archive.attempts (occurrence_id, attempt_number);

-- Per tenant, the instant before which its finished occurrences may be in the archive (the newest cutoff a
-- prune batch used): the reconciler says which part of its window is archived.
CREATE TABLE archive.horizons (
    tenant_id text PRIMARY KEY,
    archived_before timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

-- The global default: finished occurrences scheduled more than keep_s seconds ago leave the hot tables.
CREATE TABLE history_retention (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_s bigint NOT NULL CHECK (keep_s >= 3600),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO history_retention (keep_s) VALUES (30 * 86400);

-- A tenant's override of the default (NULL: the default applies).
ALTER TABLE tenants ADD COLUMN history_keep_s bigint CHECK (history_keep_s >= 3600);
