-- chronoq consumer runtime, migration 0001: the dedupe table that lives in a
-- consumer app's OWN database. The runtime inserts a row here in the same
-- transaction as the handler's business effect; a failed attempt rolls back
-- and leaves no row, a redelivery finds the row and skips the handler.

CREATE TABLE chronoq_consumer_dedupe (
    consumer_group    text NOT NULL,
    occurrence_id     uuid NOT NULL,
    schedule_id       uuid NOT NULL,
    schedule_version  integer NOT NULL,
    tenant_id         text NOT NULL,
    scheduled_for     timestamptz NOT NULL,
    applied_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, occurrence_id)
);
