-- chronoq engine, migration 0008: shard leases and the dispatch lanes (issue 12).
--
-- Engine nodes lease logical shards (shard = hash(schedule_id) mod N) with a
-- fencing epoch: every write a node makes for a shard (materializing ahead,
-- sealing, moving the dispatch cursor) is conditional on the epoch it holds,
-- so a node paused past its lease changes nothing when it wakes. All expiry
-- instants are the database's clock.
--
-- The ahead lane (dispatch_queue) holds pre-encoded messages written by the
-- shard owner's materializer for instants after the shard's seal; the relay
-- reads it in key order per shard and records progress once per page
-- (dispatch_cursors), never per row. Rows written close to or after their due
-- time, or by anyone but the owner, still go through the outbox (the late
-- lane, per-row claims).

CREATE TABLE engine_nodes (
    node_id       text PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL      -- the node counts as live until then
);

-- The number of rows is the database's shard count N (default 256), fixed for its life: the control
-- plane computes shard = hash(schedule_id) mod N when it stores a schedule.
-- Updated every few seconds by renewals: a low fill factor keeps those updates HOT.
CREATE TABLE shard_leases (
    shard        integer PRIMARY KEY CHECK (shard >= 0),
    owner        text,                      -- NULL: never owned or released
    epoch        bigint NOT NULL DEFAULT 0, -- bumped by every acquisition; fences the previous owner
    expires_at   timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at  timestamptz
) WITH (fillfactor = 50);

INSERT INTO shard_leases (shard) SELECT generate_series(0, 255);

-- The seal of each (shard, lane): every ahead-lane row with available_at before sealed_until is
-- committed. The materializer reads it under FOR SHARE and writes rows at or after it to the ahead lane
-- (earlier ones to the outbox); the relay's seal UPDATE waits for those readers, so once it commits
-- nothing can still appear before the new seal. Its own table so that moving the dispatch cursor never
-- waits for a materializer.
CREATE TABLE dispatch_seals (
    shard         integer NOT NULL REFERENCES shard_leases (shard),
    lane          text NOT NULL CHECK (lane IN ('strict', 'flexible')),
    sealed_until  timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (shard, lane)
) WITH (fillfactor = 50);

-- One cursor per (shard, lane): the key of the last ahead-lane row the broker acknowledged (rows at or
-- before it are published). Moved once per page, conditional on the lease epoch; a new owner
-- republishes from here (duplicates with the same occurrence_id, never a loss).
CREATE TABLE dispatch_cursors (
    shard             integer NOT NULL REFERENCES shard_leases (shard),
    lane              text NOT NULL CHECK (lane IN ('strict', 'flexible')),
    published_bucket  timestamptz NOT NULL DEFAULT '-infinity',
    published_round   integer NOT NULL DEFAULT 0,
    published_id      uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    epoch             bigint NOT NULL DEFAULT 0,   -- the lease epoch of the last move
    updated_at        timestamptz,
    PRIMARY KEY (shard, lane)
) WITH (fillfactor = 50);

INSERT INTO dispatch_seals (shard, lane)
SELECT s, l FROM generate_series(0, 255) AS s, (VALUES ('strict'), ('flexible')) AS v (l);
INSERT INTO dispatch_cursors (shard, lane)
SELECT s, l FROM generate_series(0, 255) AS s, (VALUES ('strict'), ('flexible')) AS v (l);

-- The ahead lane. Key order = dispatch order: time bucket (available_at truncated to the second), then
-- the weighted round-robin round (engine/rules/fair_rounds.py), then occurrence_id. No foreign key:
-- the row is transient (settled and deleted after publication) and a per-row check would cost the
-- materializer a lookup per occurrence.
CREATE TABLE dispatch_queue (
    shard          integer NOT NULL,
    lane           text NOT NULL CHECK (lane IN ('strict', 'flexible')),
    bucket         timestamptz NOT NULL,
    wrr_round      integer NOT NULL CHECK (wrr_round >= 0),
    occurrence_id  uuid NOT NULL,
    tenant_id      text NOT NULL,
    topic          text NOT NULL,
    message_key    bytea NOT NULL,
    message        bytea NOT NULL,            -- encoded schemas.messages occurrence
    scheduled_for  timestamptz NOT NULL,
    available_at   timestamptz NOT NULL,
    discarded_at   timestamptz,               -- invalidated (update, pause, cancel) before publication
    PRIMARY KEY (shard, lane, bucket, wrr_round, occurrence_id)
);

-- One row per (acknowledged page, shard): the key range the broker acknowledged and when. The settle
-- pass turns it into ENQUEUED + enqueued_at on the occurrences (off the hot path) and deletes the
-- queue rows; until then the API derives ENQUEUED from it.
CREATE TABLE dispatch_log (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard         integer NOT NULL,
    lane          text NOT NULL,
    epoch         bigint NOT NULL,
    from_bucket   timestamptz NOT NULL,       -- exclusive lower key
    from_round    integer NOT NULL,
    from_id       uuid NOT NULL,
    to_bucket     timestamptz NOT NULL,       -- inclusive upper key
    to_round      integer NOT NULL,
    to_id         uuid NOT NULL,
    rows          integer NOT NULL,
    acked_at      timestamptz NOT NULL,       -- the broker's acknowledgement (enqueued_at)
    settled_at    timestamptz
);

CREATE INDEX dispatch_log_unsettled ON dispatch_log (id) WHERE settled_at IS NULL;
CREATE INDEX dispatch_log_range ON dispatch_log (shard, lane, to_bucket);

-- A delivery the broker refused for good (too large, unknown or unauthorized topic) after bounded
-- tries: set aside with its error, so the rows behind it are not blocked; an operator inspects it.
CREATE TABLE dispatch_quarantine (
    occurrence_id  uuid NOT NULL,
    shard          integer NOT NULL,
    lane           text NOT NULL,
    tenant_id      text NOT NULL,
    topic          text NOT NULL,
    error          text NOT NULL,
    tries          integer NOT NULL,
    quarantined_at timestamptz NOT NULL,
    PRIMARY KEY (occurrence_id, topic)
);

-- chronoq status reads engine_nodes and shard_leases with typed queries now that they exist; the
-- generic row reader migration 0007 added for them is not needed any more.
DROP FUNCTION chronoq_table_rows(regclass);
