-- The engine database itself: its clock and its name.

-- name: current_instant
-- The one clock: the injected instant :now if given (tests), else the database's now().
SELECT coalesce(:now::timestamptz, now());

-- name: current_database
-- The engine database's name (the engine's consumer groups on Kafka are named after it).
SELECT current_database();
