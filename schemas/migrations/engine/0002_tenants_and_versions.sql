-- chronoq engine, migration 0002: tenants with quotas, the version history of
-- schedules, idempotent-create hashes, processed commands, and outbox rows
-- that carry schedule state changes (no occurrence).

CREATE TABLE tenants (
    tenant_id             text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    -- sha256 of the bearer token: the token itself is shown once and never stored.
    api_token_hash        bytea NOT NULL UNIQUE,
    -- HMAC key for signed commands. Verification needs the key itself, so it is
    -- stored; it never travels in the Kafka log (only signatures do).
    signing_key           bytea NOT NULL,
    state                 text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended')),
    max_active_schedules  integer NOT NULL DEFAULT 10000 CHECK (max_active_schedules >= 0),
    max_fires_per_minute  double precision NOT NULL DEFAULT 10000 CHECK (max_fires_per_minute >= 0),
    max_payload_bytes     integer NOT NULL DEFAULT 65536 CHECK (max_payload_bytes > 0),
    max_running           integer NOT NULL DEFAULT 100 CHECK (max_running > 0),
    catch_up_per_minute   integer NOT NULL DEFAULT 1000 CHECK (catch_up_per_minute >= 0),
    retry_budget_per_hour integer NOT NULL DEFAULT 1000 CHECK (retry_budget_per_hour >= 0),
    weight                integer NOT NULL DEFAULT 1 CHECK (weight > 0),
    created_at            timestamptz NOT NULL DEFAULT now()
);

-- The trigger rate a schedule implies (fires per minute), summed for the
-- tenant's trigger-rate quota; and the hash of the canonical create request,
-- so a repeated idempotency key with a different body is detected exactly.
ALTER TABLE schedules ADD COLUMN fires_per_minute double precision NOT NULL DEFAULT 0;
ALTER TABLE schedules ADD COLUMN request_hash text;

-- One row per version: every change (create, update, pause, resume, cancel)
-- bumps the version and records the full definition, so the reconciler can
-- recompute what each version should have produced.
CREATE TABLE schedule_versions (
    schedule_id  uuid NOT NULL REFERENCES schedules (schedule_id),
    version      integer NOT NULL,
    tenant_id    text NOT NULL,
    change       text NOT NULL CHECK (change IN ('create', 'update', 'pause', 'resume', 'cancel')),
    state        text NOT NULL,
    definition   jsonb NOT NULL,
    next_run_at  timestamptz,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, version)
);

-- Commands from the Kafka command topic, applied once each: the row is
-- written in the same transaction as the command's effect.
CREATE TABLE processed_commands (
    command_id    uuid PRIMARY KEY,
    tenant_id     text,
    action        text NOT NULL,
    outcome       jsonb NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now()
);

-- Schedule state changes travel through the same outbox (topic
-- chronoq.schedule-states) so they reach Kafka at least once, in commit order
-- per schedule key; they belong to no occurrence.
ALTER TABLE outbox ALTER COLUMN occurrence_id DROP NOT NULL;

CREATE INDEX schedules_tenant_state ON schedules (tenant_id, state);
