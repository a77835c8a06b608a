-- chronoq engine, migration 0009: the relay publishes one key's messages in the order they were written.
--
-- claim_due_outbox claims a message of no occurrence (schedule state, target binding, command result)
-- only when no older unsent message with the same topic and key exists (compaction keeps a key's last
-- record, docs/broker.md). This index answers that check from the few unsent keyed messages only.
CREATE INDEX outbox_unsent_keyed ON outbox (topic, message_key, id)
    WHERE occurrence_id IS NULL AND sent_at IS NULL AND discarded_at IS NULL;
