-- chronoq engine, migration 0003: attempts reported as events with fenced
-- leases, retries by error class, dead letters and replay, the overlap gate.
--
-- The current attempt's lease lives on the occurrence (lease_token,
-- lease_expires_at) so that fencing is one row lock and the reaper one index
-- scan; the attempts table keeps every attempt's history. Lease instants are
-- the engine's clock, never a worker's.

ALTER TABLE occurrences
    ADD COLUMN lease_token        uuid,            -- the RUNNING attempt's token; events with another are fenced
    ADD COLUMN lease_expires_at   timestamptz,     -- the reaper times the attempt out after this instant
    ADD COLUMN attempt_floor      integer NOT NULL DEFAULT 0,  -- attempts before the last replay (not counted)
    ADD COLUMN replay_count       integer NOT NULL DEFAULT 0,
    ADD COLUMN dispatched_at      timestamptz,     -- released by the overlap gate (in flight from then on)
    ADD COLUMN finished_at        timestamptz,     -- reached SUCCEEDED, DEAD, CANCELED or SKIPPED_OVERLAP
    ADD COLUMN last_error_class   text,
    ADD COLUMN last_error_message text,
    ADD COLUMN dead_reason        text
        CHECK (dead_reason IN ('permanent_error', 'max_attempts', 'deadline', 'retry_budget'));

-- The reaper's scan: running attempts by lease expiry.
CREATE INDEX occurrences_lease_expiry ON occurrences (lease_expires_at) WHERE state = 'RUNNING';
-- Dead letters by tenant, newest last (list and DLQ size).
CREATE INDEX occurrences_dead ON occurrences (tenant_id, finished_at, occurrence_id) WHERE state = 'DEAD';

ALTER TABLE attempts
    ADD COLUMN worker     text,                    -- host:pid of the consumer process that ran it
    ADD COLUMN permanent  boolean;                 -- the failure was permanent (never retried)

-- Retries spent per tenant per clock hour (UTC): the tenant's retry budget
-- (tenants.retry_budget_per_hour) is checked and spent with one conditional
-- upsert, so concurrent failures cannot overspend it.
CREATE TABLE tenant_retry_usage (
    tenant_id     text NOT NULL,
    window_start  timestamptz NOT NULL,
    retries       integer NOT NULL CHECK (retries >= 0),
    PRIMARY KEY (tenant_id, window_start)
);

-- Outbox rows held by the overlap gate (claim that never expires) until it
-- decides to dispatch or skip them; its scan looks only at these.
CREATE INDEX outbox_overlap_held ON outbox (available_at)
    WHERE claim_expires_at = 'infinity' AND sent_at IS NULL AND discarded_at IS NULL;
