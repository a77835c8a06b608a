-- Local placeholder (lifecycle branch): keeps the versions contiguous until the history partitioning
-- migration takes this number. Drop this file at merge and renumber 0013.
SELECT 1;
