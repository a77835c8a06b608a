-- chronoq engine, migration 0001: schedules, occurrences, attempts, outbox.
-- Text columns with CHECK constraints instead of enums: adding a value to an
-- enum inside a transaction bites (pgqueuer's upgrade incident).
-- Nothing here is UNLOGGED: an occurrence or outbox row that survived COMMIT
-- must survive a crash of the postmaster.

CREATE TABLE schedules (
    schedule_id        uuid PRIMARY KEY,
    tenant_id          text NOT NULL,
    kind               text NOT NULL CHECK (kind IN ('once', 'cron', 'rate')),
    expression         text NOT NULL,
    time_zone          text NOT NULL DEFAULT 'UTC',
    dst_repeat         text NOT NULL DEFAULT 'first' CHECK (dst_repeat IN ('first', 'both')),
    dst_gap            text NOT NULL DEFAULT 'skip' CHECK (dst_gap IN ('skip', 'shift')),
    anchor             timestamptz,            -- rate: fires at anchor + k * period
    start_at           timestamptz,
    end_at             timestamptz,
    version            integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    state              text NOT NULL DEFAULT 'active'
                       CHECK (state IN ('active', 'paused', 'canceled', 'completed')),
    next_run_at        timestamptz,            -- UTC cursor; NULL once exhausted
    target             text NOT NULL,
    payload            jsonb NOT NULL DEFAULT '{}'::jsonb,
    priority           text NOT NULL DEFAULT 'strict' CHECK (priority IN ('strict', 'flexible')),
    flexible_window_s  integer NOT NULL DEFAULT 0 CHECK (flexible_window_s >= 0),
    misfire_policy     text NOT NULL DEFAULT 'fire_once',
    max_lateness_s     integer NOT NULL DEFAULT 60 CHECK (max_lateness_s >= 0),
    overlap_policy     text NOT NULL DEFAULT 'allow'
                       CHECK (overlap_policy IN ('allow', 'skip_if_running', 'queue_one')),
    retry_max_attempts integer NOT NULL DEFAULT 3 CHECK (retry_max_attempts >= 1),
    retry_base_s       double precision NOT NULL DEFAULT 1 CHECK (retry_base_s > 0),
    retry_cap_s        double precision NOT NULL DEFAULT 300 CHECK (retry_cap_s > 0),
    deadline_s         integer,                -- occurrence deadline after scheduled_for
    shard              integer NOT NULL,
    created_by_key     text,                   -- idempotent create, scoped by tenant
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, created_by_key)
);

-- The materializer's scan: active schedules by shard and cursor.
CREATE INDEX schedules_due ON schedules (shard, next_run_at) WHERE state = 'active';
CREATE INDEX schedules_tenant ON schedules (tenant_id, created_at, schedule_id);

CREATE TABLE occurrences (
    occurrence_id     uuid PRIMARY KEY,        -- uuid5(schedule_id, version, scheduled_for)
    schedule_id       uuid NOT NULL REFERENCES schedules (schedule_id),
    schedule_version  integer NOT NULL,
    tenant_id         text NOT NULL,
    target            text NOT NULL,
    scheduled_for     timestamptz NOT NULL,
    available_at      timestamptz NOT NULL,
    state             text NOT NULL DEFAULT 'SCHEDULED'
                      CHECK (state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'SUCCEEDED', 'RETRY_WAIT',
                                       'DEAD', 'MISSED', 'CANCELED', 'SKIPPED_OVERLAP')),
    attempt_count     integer NOT NULL DEFAULT 0,
    enqueued_at       timestamptz,             -- first broker acknowledgement
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (schedule_id, schedule_version, scheduled_for)
);

CREATE INDEX occurrences_schedule ON occurrences (schedule_id, scheduled_for);
CREATE INDEX occurrences_open ON occurrences (schedule_id)
    WHERE state IN ('SCHEDULED', 'ENQUEUED', 'RUNNING', 'RETRY_WAIT');

CREATE TABLE attempts (
    attempt_id        uuid PRIMARY KEY,
    occurrence_id     uuid NOT NULL REFERENCES occurrences (occurrence_id),
    attempt_number    integer NOT NULL,
    lease_token       uuid NOT NULL UNIQUE,
    consumer_group    text,
    started_at        timestamptz NOT NULL,
    heartbeat_at      timestamptz,
    lease_expires_at  timestamptz,
    finished_at       timestamptz,
    result            text CHECK (result IN ('succeeded', 'failed', 'timed_out', 'fenced', 'canceled')),
    error_class       text,
    error_message     text
);

CREATE INDEX attempts_occurrence ON attempts (occurrence_id, attempt_number);

-- Transactional outbox. The relay claims rows with a claim token and marks
-- them sent only after the broker acknowledged, and only while it still holds
-- that claim (a paused relay whose claim expired changes nothing).
-- Rows are found by state, never by "id > last seen": sequence values are
-- taken before commit, so ids commit out of order.
CREATE TABLE outbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurrence_id     uuid NOT NULL REFERENCES occurrences (occurrence_id),
    tenant_id         text NOT NULL,
    topic             text NOT NULL,
    message_key       bytea NOT NULL,
    message           bytea NOT NULL,          -- encoded schemas.messages occurrence
    scheduled_for     timestamptz NOT NULL,    -- for schedule_lag at publish time
    available_at      timestamptz NOT NULL,
    claim_token       uuid,
    claim_expires_at  timestamptz,
    publish_attempts  integer NOT NULL DEFAULT 0,
    last_error        text,
    sent_at           timestamptz,
    discarded_at      timestamptz,             -- occurrence invalidated before publication
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX outbox_pending ON outbox (available_at)
    WHERE sent_at IS NULL AND discarded_at IS NULL;
CREATE INDEX outbox_occurrence ON outbox (occurrence_id);
