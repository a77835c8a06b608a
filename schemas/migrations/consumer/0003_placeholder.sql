-- Local placeholder (lifecycle branch): keeps the versions contiguous until the consumer-burst merge's
-- migration takes this number. Drop this file at merge and renumber 0004.
SELECT 1;
