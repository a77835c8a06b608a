-- chronoq engine, migration 0007 (after 0006, tenant identity): what recovery and the reconciler need to
-- prove that no occurrence was silently omitted.

-- Missed slots summarised instead of enumerated: when a schedule missed more
-- slots than one pass records as MISSED rows, the rest are recorded here as one
-- range per pass (first and last missed instant, how many), in the
-- materializer's transaction. The reconciler counts a slot inside a range of
-- the same schedule version as accounted for.
CREATE TABLE missed_ranges (
    schedule_id       uuid NOT NULL REFERENCES schedules (schedule_id),
    schedule_version  integer NOT NULL,
    first_missed      timestamptz NOT NULL,
    last_missed       timestamptz NOT NULL CHECK (last_missed >= first_missed),
    missed_count      bigint CHECK (missed_count > 0),   -- NULL: more than can be counted (cron over ten years)
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, schedule_version, first_missed)
);

-- The tenant's catch-up budget (tenants.catch_up_per_minute) as a token
-- bucket, one row per tenant, shared by every engine node: a node locks the
-- row, applies engine.rules.token_bucket.take to it and writes it back in the
-- transaction that enqueues the catch-up occurrences, so nodes never
-- overspend it together.
CREATE TABLE tenant_catch_up_buckets (
    tenant_id   text PRIMARY KEY REFERENCES tenants (tenant_id),
    tokens      double precision NOT NULL CHECK (tokens >= 0),
    updated_at  timestamptz NOT NULL
);

-- Every `chronoq reconcile` run: its window, counts and first offenders, so
-- `chronoq status` shows the last result and a dashboard can chart them.
CREATE TABLE reconcile_runs (
    run_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    window_from   timestamptz NOT NULL,
    window_to     timestamptz NOT NULL,
    tenant_id     text,                      -- NULL: every tenant
    clean         boolean NOT NULL,          -- nothing missing, unexpected, duplicated or violating a policy
    counts        jsonb NOT NULL,
    offenders     jsonb NOT NULL DEFAULT '[]'::jsonb,
    duration_s    double precision NOT NULL
);
CREATE INDEX reconcile_runs_recent ON reconcile_runs (finished_at);

-- Occurrences published whose attempt events never arrived: the stuck-occurrence
-- pass re-publishes them a bounded number of times and flags the rest.
CREATE TABLE stuck_occurrences (
    occurrence_id     uuid PRIMARY KEY REFERENCES occurrences (occurrence_id),
    first_seen_at     timestamptz NOT NULL,
    redeliveries      integer NOT NULL DEFAULT 0 CHECK (redeliveries >= 0),
    last_redelivered  timestamptz,
    flagged_at        timestamptz,            -- redeliveries exhausted: an operator must look
    resolved_at       timestamptz             -- left ENQUEUED afterwards (an attempt event arrived)
);
CREATE INDEX stuck_occurrences_open ON stuck_occurrences (first_seen_at) WHERE resolved_at IS NULL;

-- The stuck pass's scan: occurrences waiting in ENQUEUED, by when they got there.
-- Partial, so it holds only what is in flight.
CREATE INDEX occurrences_enqueued_since ON occurrences (updated_at) WHERE state = 'ENQUEUED';

-- The reconciler's window scan. BRIN: occurrences are written in roughly
-- scheduled_for order (a horizon ahead), so a few hundred bytes index millions
-- of rows and the hot path pays almost nothing to maintain it.
CREATE INDEX occurrences_scheduled_brin ON occurrences USING brin (scheduled_for);

-- `chronoq status` shows tables that other migrations add (shard leases, engine nodes) whatever their
-- columns, and only when they exist: rows of a table named at run time, as JSON. Prepared statements
-- calling it do not depend on the table existing.
CREATE FUNCTION chronoq_table_rows(source regclass) RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT to_jsonb(t) FROM %s t', source);
END
$$;
