-- local placeholder (not committed upstream): keeps versions contiguous until migration 0013 lands from another branch; dropped at merge
SELECT 1;
