-- chronoq engine, migration 0015: one consumer group per target reports attempts,
-- and takeovers follow the order of the consumer's dedupe claims.
--
-- Several consumer groups may read one target's topic (billing applies it,
-- audit observes it). If each reported attempts, the second group's
-- `started` would take the first group's lease over, the first group's
-- failure would be fenced and never retried, and the second group's
-- `already_applied` would settle the occurrence: the owner's effect lost.
-- The attempt ledger applies only the events of the target's owning group;
-- the others are observers, counted and ignored. A target without a row is
-- claimed by the first group whose `started` the engine applies for it; an
-- operator registers or changes the owner explicitly
-- (`chronoq target owner`).

CREATE TABLE target_attempt_owners (
    target          text PRIMARY KEY,
    consumer_group  text NOT NULL CHECK (consumer_group <> ''),
    registered_by   text NOT NULL CHECK (registered_by IN ('first_start', 'operator')),
    registered_at   timestamptz NOT NULL DEFAULT now()
);

-- Takeover by claim order, not arrival order. A redelivery's `started` takes
-- a RUNNING attempt's lease over (the previous worker died). Only the worker
-- whose dedupe insert came last can still commit: an earlier one's
-- transaction must have ended for the later insert to succeed. The consumer
-- sends its dedupe transaction's id (pg_current_xact_id() of its database:
-- increasing, never reused) as claim_order; a takeover is accepted only with
-- a greater claim_order than the current lease's, so a stalled worker's late
-- `started` cannot take the lease of the worker that replaced it. Null: an
-- older runtime's attempt, judged by arrival order as before.
ALTER TABLE attempts ADD COLUMN claim_order bigint;
-- The history archive keeps attempts column for column (archived with SELECT *, read with UNION ALL).
ALTER TABLE archive.attempts ADD COLUMN claim_order bigint;
