-- chronoq engine, migration 0010: issue 10 items 5 and 6.
--
-- Attempt credentials are per target (not per consumer group): heartbeat,
-- succeeded and failed events do not name a group, so a group binding could
-- not be checked on every event, while "holds the target's credential" can.
-- The table was not used before this migration, so the column simply goes.
-- revoked_at is the instant from which a credential is no longer accepted:
-- now for a revocation, now + grace for the credential a rotation replaces.
DROP INDEX attempt_credentials_live;
ALTER TABLE attempt_credentials DROP COLUMN consumer_group;
CREATE INDEX attempt_credentials_target ON attempt_credentials (target);

-- Poison rows: the relay counts the non-transient publish failures of a row
-- (too large, invalid or unauthorized topic) and quarantines it after a
-- bounded number; a quarantined row is never claimed again (discarded_at),
-- and quarantined_at tells it apart from a row discarded because its
-- occurrence finished.
ALTER TABLE outbox ADD COLUMN poison_failures integer NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN quarantined_at timestamptz;
-- An occurrence whose delivery was quarantined is DEAD for this reason.
ALTER TABLE occurrences DROP CONSTRAINT occurrences_dead_reason_check;
ALTER TABLE occurrences ADD CONSTRAINT occurrences_dead_reason_check
    CHECK (dead_reason IN ('permanent_error', 'max_attempts', 'deadline', 'retry_budget', 'unpublishable'));
