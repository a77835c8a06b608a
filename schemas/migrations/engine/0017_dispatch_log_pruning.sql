-- chronoq engine, migration 0017 (after the time-partitioned history, 0016): settled dispatch-log entries are
-- forgotten by the age of their settling, in bounded deletes that read only what they delete.
--
-- An entry is one shard's share of one acknowledged page. With flexible traffic a page spreads over many
-- shards, about one entry per three occurrences (the 30 % flexible soak, docs/benchmarks.md), so at 1,000
-- occurrences/s the log takes ~300 entries/s. The prune (schemas/queries/dispatch.sql, prune_settled_log)
-- finds the entries settled before its cutoff through the index below instead of scanning the ones it keeps.
-- Every entry is inserted, updated once (settled) and deleted within keep_log: autovacuum visits the table
-- after 5 % of it changed rather than 20 %, so the dead tuples between its visits stay a fraction of the
-- live ones (the soak saw 160,429 dead beside 43,022 live).
CREATE INDEX dispatch_log_settled ON dispatch_log (settled_at) WHERE settled_at IS NOT NULL;
ALTER TABLE dispatch_log SET (autovacuum_vacuum_scale_factor = 0.05);
