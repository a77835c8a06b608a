-- chronoq engine, migration 0026: schedule cohorts, one cursor for many plain schedules.
--
-- The materializer advanced each schedule's cursor once per fire: a non-HOT update of the wide schedules row
-- (next_run_at keys the due index), ~60 % of the materializer's statement and the largest single cost of an
-- occurrence (docs/benchmarks.md stops 14 and 39). Schedules of one tenant and one shard that fire alike
-- (same time spec and misfire policy, none of the per-schedule rules: no end, no calendar, no run limit, no
-- overlap gate) now share a cursor: a cohort. A pass advances the cohort's narrow row once and writes each
-- member's occurrence and delivery, never the member's row. docs/dispatch.md "Cohorts" has the rules:
--
-- * A member's own next_run_at and runs are frozen while it is a member; its cursor is its cohort's
--   next_run_at and its runs are runs + (cohort.fires - cohort_base). chronoq_effective_schedule(s) reads a
--   schedule as if it had its own cursor (what every API read returns).
-- * Any change of a member (lock_schedule, a requested run) first takes it out of its cohort (leave_cohort):
--   its own cursor and runs become the cohort's, and members_version moves, so a pass that read the old
--   membership fails its compare-and-set on the cohort and writes nothing for it.
-- * A create joins a cohort at its first fire (claim_cohorts) without waiting for a locked one (it makes a
--   new one instead): several cohorts may share a key and a cursor, which only costs a row.
-- * A cohort whose fire is not plain on-time work (missed, caught up, exhausted) is dissolved: its members
--   get their own cursors back, and the per-schedule path judges them.
CREATE TABLE schedule_cohorts (
    cohort_id       uuid PRIMARY KEY,
    shard           integer NOT NULL,
    tenant_id       text NOT NULL,
    spec_key        text NOT NULL,         -- engine/rules/cohorts.py CohortSpec.key: the time spec and misfire policy
    -- The fields the key is made of, as every member has them (a pass reads them once per cohort).
    kind            text NOT NULL,
    expression      text NOT NULL,
    time_zone       text NOT NULL,
    dst_repeat      text NOT NULL,
    dst_gap         text NOT NULL,
    anchor          timestamptz,
    misfire_policy  text NOT NULL,
    max_lateness_s  integer NOT NULL,
    next_run_at     timestamptz NOT NULL,  -- the members' cursor
    fires           bigint NOT NULL DEFAULT 0,  -- fires materialized since the cohort was made (members' runs)
    members         integer NOT NULL DEFAULT 0, -- members joined minus members left (bounds a cohort's size)
    members_version bigint NOT NULL DEFAULT 0,  -- moves with every join and leave: a pass's compare-and-set
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
-- The materializer's due read, per shard, oldest cursor first.
CREATE INDEX schedule_cohorts_due ON schedule_cohorts (shard, next_run_at);
-- A create's lookup of a cohort to join.
CREATE INDEX schedule_cohorts_key ON schedule_cohorts (shard, tenant_id, spec_key, next_run_at);

ALTER TABLE schedules
    ADD COLUMN cohort_id   uuid,    -- NULL: the schedule keeps its own cursor
    ADD COLUMN cohort_base bigint;  -- the cohort's fires when it joined
-- A cohort's members (only members are indexed).
CREATE INDEX schedules_cohort ON schedules (cohort_id) WHERE cohort_id IS NOT NULL;

-- The per-schedule due read skips members: their own next_run_at is frozen.
DROP INDEX schedules_due;
CREATE INDEX schedules_due ON schedules (shard, next_run_at) WHERE state = 'active' AND cohort_id IS NULL;

-- A schedule row as if it kept its own cursor: a member's next_run_at and runs from its cohort.
CREATE FUNCTION chronoq_effective_schedule(s schedules) RETURNS schedules
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c record;
BEGIN
    IF s.cohort_id IS NOT NULL THEN
        SELECT next_run_at, fires INTO c FROM schedule_cohorts WHERE cohort_id = s.cohort_id;
        IF FOUND THEN
            s.next_run_at := c.next_run_at;
            s.runs := s.runs + (c.fires - s.cohort_base)::integer;
        END IF;
    END IF;
    RETURN s;
END
$$;

-- Every schedule as if it kept its own cursor (for people and tests reading the database directly: a
-- member's own next_run_at and runs in schedules are frozen at its join).
CREATE VIEW schedules_effective AS
SELECT e.* FROM schedules s CROSS JOIN LATERAL chronoq_effective_schedule(s) e;
