-- chronoq engine, migration 0005: exclusion calendars (tenant-scoped, named,
-- versioned lists of local dates a schedule does not fire on) and run limits
-- (a schedule completes after max_runs fires).

-- One row per calendar; its dates live in calendar_versions, one row per
-- version, so the dates a past materialization used stay readable (the
-- reconciler's history). Names are unique per tenant among calendars not
-- deleted; a deleted calendar keeps its row because finished schedules still
-- reference it.
CREATE TABLE calendars (
    calendar_id  uuid PRIMARY KEY,
    tenant_id    text NOT NULL,
    name         text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    version      integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    time_zone    text,                     -- NULL: read on each referencing schedule's clock
    description  text NOT NULL DEFAULT '',
    entry_count  integer NOT NULL CHECK (entry_count >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    deleted_at   timestamptz,
    UNIQUE (calendar_id, tenant_id)         -- target of the schedules' tenant-checked reference
);

CREATE UNIQUE INDEX calendars_tenant_name ON calendars (tenant_id, name) WHERE deleted_at IS NULL;

CREATE TABLE calendar_versions (
    calendar_id  uuid NOT NULL REFERENCES calendars (calendar_id),
    version      integer NOT NULL,
    tenant_id    text NOT NULL,
    change       text NOT NULL CHECK (change IN ('create', 'update', 'import', 'delete')),
    time_zone    text,
    description  text NOT NULL DEFAULT '',
    -- [[start, end, label], ...]: ISO dates, end inclusive, label or null; in the order given.
    entries      jsonb NOT NULL,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (calendar_id, version)
);

-- A schedule references at most one calendar by id; the name is kept beside it
-- for display (calendar names never change). max_runs bounds the number of
-- runs; runs counts them durably: occurrences materialized to run, in the
-- transaction that inserts them, given back when the control plane cancels
-- one before any attempt started. MISSED and excluded slots are not runs.
-- The reference includes the tenant, so the database itself refuses a schedule
-- that points at another tenant's calendar.
ALTER TABLE schedules
    ADD COLUMN calendar_id   uuid,
    ADD COLUMN calendar_name text,
    ADD COLUMN max_runs      integer CHECK (max_runs IS NULL OR max_runs >= 1),
    ADD COLUMN runs          integer NOT NULL DEFAULT 0 CHECK (runs >= 0),
    ADD CONSTRAINT schedules_calendar_of_tenant FOREIGN KEY (calendar_id, tenant_id)
        REFERENCES calendars (calendar_id, tenant_id);

-- "Is this calendar still used?" (delete-if-unused) looks only at live schedules.
CREATE INDEX schedules_calendar ON schedules (calendar_id)
    WHERE calendar_id IS NOT NULL AND state IN ('active', 'paused');
