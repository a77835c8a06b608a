-- chronoq engine, migration 0025: the (tenant_id, state) index holds only schedules that are not active.
--
-- The materializer's cursor advance is not a HOT update (next_run_at keys the due index), so it wrote a new
-- entry into every index of schedules, (tenant_id, state) among them, for a row whose tenant and state it
-- does not change. Its one reader at scale, the quota check's count of a tenant's live schedules, is a
-- counter since migration 0024. What remains wants the rare states: a tenant's paused, canceled or completed
-- schedules (a listing filtered by state, whose custom plan names the state, so the planner proves the
-- predicate). Active ones are most of a tenant and are read in creation order through schedules_tenant.
-- A partial index receives no entry for a row version outside its predicate: an active schedule's advance now
-- writes four index entries, not five. Measured on one connection (load_tests.materialize_parts, 1,000,000
-- background schedules, docs/benchmarks.md stop 44): the cursor advance ~20 % and the materializer's
-- statement ~12 % cheaper per row without the index.
DROP INDEX schedules_tenant_state;
CREATE INDEX schedules_tenant_state ON schedules (tenant_id, state) WHERE state <> 'active';
