-- chronoq engine, migration 0010: how far the attempt processor has read each
-- partition of chronoq.attempts, so the lease reaper judges leases only by
-- events the engine has applied.
--
-- A lease expires when no heartbeat arrived in time. During a burst the
-- heartbeats and outcomes of healthy attempts may sit unapplied in the topic
-- for longer than a lease lasts; a reaper that compared leases with "now"
-- would time those attempts out in bulk. Each row says: every attempt event
-- of this partition produced before applied_through has been applied (the
-- processor had read the partition to its end as of then). The reaper times
-- out only leases that expired before the earliest of these instants.

CREATE TABLE attempt_event_progress (
    partition        integer PRIMARY KEY CHECK (partition >= 0),
    applied_through  timestamptz NOT NULL,     -- the engine's clock
    updated_at       timestamptz NOT NULL DEFAULT now()
);
