-- Commands from chronoq.commands: each is applied once, its outcome stored with its effect.

-- name: claim_command
-- Records an authenticated command as being processed; returns nothing if :tenant_id sent that command id
-- before (a replay or a redelivery), in which case its stored outcome is answered again. Command ids are
-- scoped by tenant: another tenant's command with the same id is a command of its own.
INSERT INTO processed_commands (tenant_id, command_id, action, outcome, processed_at)
VALUES (:tenant_id, :command_id, :action, '{}'::jsonb, coalesce(:now::timestamptz, now()))
ON CONFLICT (tenant_id, command_id) DO NOTHING
RETURNING command_id;

-- name: command_outcome
-- The stored outcome of one of :tenant_id's processed commands.
SELECT tenant_id, outcome FROM processed_commands WHERE tenant_id = :tenant_id AND command_id = :command_id;

-- name: record_command_outcome
-- Stores the outcome of a command, in the transaction of its effect.
UPDATE processed_commands SET outcome = :outcome WHERE tenant_id = :tenant_id AND command_id = :command_id;
