-- Exclusion calendars: the control plane's lifecycle of a tenant's calendars, and what the materializer
-- and the schedule lifecycle read of them. Every control-plane query is scoped by tenant_id: another
-- tenant's calendar is simply not found. :now is NULL in production (the database's clock rules).

-- name: insert_calendar
-- Creates a calendar at version 1; returns nothing when the tenant already has a live calendar of that name.
INSERT INTO calendars (calendar_id, tenant_id, name, version, time_zone, description, entry_count, created_at,
                       updated_at)
VALUES (:calendar_id, :tenant_id, :name, 1, :time_zone, :description, :entry_count,
        coalesce(:now::timestamptz, now()), coalesce(:now::timestamptz, now()))
ON CONFLICT (tenant_id, name) WHERE deleted_at IS NULL DO NOTHING
RETURNING *;

-- name: insert_calendar_version
-- Records one version of a calendar with its full list of entries.
INSERT INTO calendar_versions (calendar_id, version, tenant_id, change, time_zone, description, entries, changed_at)
VALUES (:calendar_id, :version, :tenant_id, :change, :time_zone, :description, :entries,
        coalesce(:now::timestamptz, now()));

-- name: get_calendar
-- A tenant's live calendar by name, with the entries of its current version.
SELECT c.*, v.entries
FROM calendars c JOIN calendar_versions v ON v.calendar_id = c.calendar_id AND v.version = c.version
WHERE c.tenant_id = :tenant_id AND c.name = :name AND c.deleted_at IS NULL;

-- name: get_calendar_by_id
-- A tenant's calendar by id (deleted or not: finished schedules keep referencing it), with current entries.
SELECT c.*, v.entries
FROM calendars c JOIN calendar_versions v ON v.calendar_id = c.calendar_id AND v.version = c.version
WHERE c.tenant_id = :tenant_id AND c.calendar_id = :calendar_id;

-- name: lock_calendar
-- A tenant's live calendar by name, locked for a change (a schedule referencing it waits, and vice versa).
SELECT * FROM calendars WHERE tenant_id = :tenant_id AND name = :name AND deleted_at IS NULL FOR UPDATE;

-- name: share_calendar
-- A tenant's live calendar by name, share-locked while a schedule starts referencing it, so a concurrent
-- delete cannot remove it between the check and the commit.
SELECT * FROM calendars WHERE tenant_id = :tenant_id AND name = :name AND deleted_at IS NULL FOR SHARE;

-- name: update_calendar
-- Writes a new version of a locked calendar.
UPDATE calendars
SET version = version + 1, time_zone = :time_zone, description = :description, entry_count = :entry_count,
    updated_at = coalesce(:now::timestamptz, now())
WHERE calendar_id = :calendar_id AND tenant_id = :tenant_id
RETURNING *;

-- name: delete_calendar
-- Marks a locked calendar deleted (a new version); its name is free again, its history stays.
UPDATE calendars
SET version = version + 1, deleted_at = coalesce(:now::timestamptz, now()),
    updated_at = coalesce(:now::timestamptz, now())
WHERE calendar_id = :calendar_id AND tenant_id = :tenant_id
RETURNING *;

-- name: calendar_users
-- How many live (active or paused) schedules reference the calendar, and a few of their ids.
SELECT count(*) AS schedules, (array_agg(schedule_id ORDER BY created_at))[1:5] AS some
FROM schedules
WHERE calendar_id = :calendar_id AND state IN ('active', 'paused');

-- name: list_calendars
-- A page of a tenant's live calendars in creation order, after the cursor (created_at, calendar_id).
SELECT *
FROM calendars
WHERE tenant_id = :tenant_id AND deleted_at IS NULL
  AND (:after_at::timestamptz IS NULL OR (created_at, calendar_id) > (:after_at, :after_id::uuid))
ORDER BY created_at, calendar_id
LIMIT :limit;

-- name: list_calendar_versions
-- The version history of a tenant's live calendar (by name), oldest first.
SELECT v.*
FROM calendar_versions v JOIN calendars c ON c.calendar_id = v.calendar_id
WHERE c.tenant_id = :tenant_id AND c.name = :name AND c.deleted_at IS NULL
ORDER BY v.version;

-- name: share_calendars_for_materialization
-- The current version of each calendar referenced by a batch, share-locked for the materializer's
-- transaction: a calendar update commits before it (and is used) or waits until after it.
SELECT calendar_id, version, time_zone
FROM calendars
WHERE calendar_id = ANY (:calendar_ids::uuid[])
FOR SHARE;

-- name: calendar_version_entries
-- The entries of the given (calendar_id, version) pairs.
SELECT v.calendar_id, v.version, v.time_zone, v.entries
FROM calendar_versions v
JOIN unnest(:calendar_ids::uuid[], :versions::int[]) AS wanted(calendar_id, version)
  ON wanted.calendar_id = v.calendar_id AND wanted.version = v.version;

-- name: calendar_history_by_id
-- Every version of a tenant's calendar (deleted or not) with its name, oldest first: what a timeline needs
-- to tell which version was in force at a slot.
SELECT c.name, v.*
FROM calendar_versions v JOIN calendars c ON c.calendar_id = v.calendar_id
WHERE c.tenant_id = :tenant_id AND c.calendar_id = :calendar_id
ORDER BY v.version;

-- name: share_calendars_by_names
-- The tenant's live calendars of the given names, share-locked while a batch of schedules starts referencing
-- them (a name another tenant uses is simply not found).
SELECT calendar_id, name
FROM calendars
WHERE tenant_id = :tenant_id AND name = ANY (:names::text[]) AND deleted_at IS NULL
FOR SHARE;
