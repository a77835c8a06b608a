-- chronoq engine, migration 0004: operator features — where an occurrence came
-- from (the schedule's own slots, a backfill, a manual "trigger now") and who
-- asked for it; operator tokens and console sessions; the pacing of a tenant's
-- catch-up work (backfills); an index for the console's last-hour views.

ALTER TABLE occurrences
    ADD COLUMN origin       text NOT NULL DEFAULT 'schedule' CHECK (origin IN ('schedule', 'backfill', 'manual')),
    ADD COLUMN requested_by text;              -- backfill / manual: the principal that asked (tenant:acme, operator:alice)

-- A manual occurrence has an id of its own and fires "now", which may be the
-- very instant of a slot: uniqueness per (schedule, version, instant) is the
-- guarantee of slot occurrences (schedule and backfill), so the constraint
-- becomes a partial unique index that manual ones do not take part in. A slot
-- occurrence's id is also derived from exactly these columns (primary key).
CREATE UNIQUE INDEX occurrences_slot ON occurrences (schedule_id, schedule_version, scheduled_for)
    WHERE origin <> 'manual';
ALTER TABLE occurrences DROP CONSTRAINT occurrences_schedule_id_schedule_version_scheduled_for_key;

-- The console's last-hour views (lag percentiles, throughput) per tenant, and
-- across tenants by skip scan over the few tenant ids.
CREATE INDEX occurrences_tenant_time ON occurrences (tenant_id, scheduled_for);

-- Operator tokens see every tenant in the console. Only the SHA-256 of a token
-- is stored; the token is shown once by `chronoq operator token`.
CREATE TABLE operator_tokens (
    token_hash  bytea PRIMARY KEY,
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- A console sign-in: the cookie holds a random session id (only its SHA-256
-- is stored here) and every state-changing form carries the session's CSRF
-- token. A tenant session ends when its tenant is suspended (checked on use).
CREATE TABLE console_sessions (
    session_hash  bytea PRIMARY KEY,
    tenant_id     text REFERENCES tenants (tenant_id),   -- NULL for an operator session
    operator      text,                                  -- the operator token's name
    csrf_token    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    CHECK ((tenant_id IS NULL) <> (operator IS NULL))
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

-- The tenant's catch-up pacing (tenants.catch_up_per_minute), as a virtual
-- clock: a backfill of n slots releases them at most catch_up_per_minute per
-- minute after free_at, and moves free_at past them (one row lock per tenant).
CREATE TABLE tenant_catch_up (
    tenant_id  text PRIMARY KEY REFERENCES tenants (tenant_id),
    free_at    timestamptz NOT NULL
);
