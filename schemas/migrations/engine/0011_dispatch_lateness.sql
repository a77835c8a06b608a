-- chronoq engine, migration 0011 (after 0010, attempt credentials and poison rows): lateness judged again at dispatch.
--
-- Each delivery of an on-time occurrence carries the instant after which it is late and its schedule's
-- misfire policy, so a relay (which never reads schedules) can apply the policy when it reaches the
-- delivery late (the relay or the broker was down): schemas/dispatch_lateness.py decides, the relay
-- records MISSED. NULL late_after: never re-judged (catch-up occurrences, which the tenant's token
-- bucket paces; retries, replays, backfills and manual triggers, which are requests).

ALTER TABLE dispatch_queue ADD COLUMN late_after timestamptz, ADD COLUMN misfire_policy text;
ALTER TABLE outbox ADD COLUMN late_after timestamptz, ADD COLUMN misfire_policy text;
