-- Commands from chronoq.commands: each is applied once, its outcome stored with its effect.

-- name: claim_command
-- Records an authenticated command as being processed; returns nothing if it was processed before
-- (a replay or a redelivery), in which case its stored outcome is answered again.
INSERT INTO processed_commands (command_id, tenant_id, action, outcome, processed_at)
VALUES (:command_id, :tenant_id, :action, '{}'::jsonb, coalesce(:now::timestamptz, now()))
ON CONFLICT (command_id) DO NOTHING
RETURNING command_id;

-- name: command_outcome
-- The stored outcome of a processed command.
SELECT tenant_id, outcome FROM processed_commands WHERE command_id = :command_id;

-- name: record_command_outcome
-- Stores the outcome of a command, in the transaction of its effect.
UPDATE processed_commands SET outcome = :outcome WHERE command_id = :command_id;
