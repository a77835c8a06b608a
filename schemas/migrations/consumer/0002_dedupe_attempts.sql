-- chronoq consumer runtime, migration 0002: the dedupe row records which
-- attempt applied the effect (the delivery number and the attempt's lease
-- token), so a later delivery that finds the row can tell the engine which
-- attempt it was.

ALTER TABLE chronoq_consumer_dedupe
    ADD COLUMN attempt      integer,
    ADD COLUMN lease_token  uuid;
