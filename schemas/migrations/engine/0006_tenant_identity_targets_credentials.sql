-- chronoq engine, migration 0006: tenant-scoped command identity, target
-- ownership, and the credentials that will authenticate attempt events.

-- Command ids are unique per tenant, not globally: tenant B sending a command
-- with tenant A's command id is a new command of B's, never answered with A's
-- stored outcome. Only authenticated commands are recorded, so every row has
-- a tenant (rows without one could never be matched again).
DELETE FROM processed_commands WHERE tenant_id IS NULL;
ALTER TABLE processed_commands ALTER COLUMN tenant_id SET NOT NULL;
ALTER TABLE processed_commands DROP CONSTRAINT processed_commands_pkey;
ALTER TABLE processed_commands ADD PRIMARY KEY (tenant_id, command_id);

-- The target registry. A target (the handler an occurrence topic feeds)
-- belongs to one tenant: the first to create a schedule on it, or the one an
-- operator registered it to. An operator may grant it to further tenants.
-- `version` increases with every change of the target's tenants; each change
-- is announced on chronoq.target-bindings (the consumer apps' view).
CREATE TABLE targets (
    target        text PRIMARY KEY CHECK (target ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$'),
    owner_tenant  text NOT NULL REFERENCES tenants (tenant_id),
    version       integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE target_grants (
    target      text NOT NULL REFERENCES targets (target),
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    granted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, tenant_id)
);
CREATE INDEX target_grants_tenant ON target_grants (tenant_id);

-- Targets already in use keep working for every tenant that uses them: the
-- oldest schedule's tenant owns the target, the others are granted it.
INSERT INTO targets (target, owner_tenant, created_at, updated_at)
SELECT DISTINCT ON (s.target) s.target, s.tenant_id, s.created_at, now()
FROM schedules s JOIN tenants t ON t.tenant_id = s.tenant_id
WHERE s.target ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$'
ORDER BY s.target, s.created_at, s.schedule_id;

INSERT INTO target_grants (target, tenant_id)
SELECT DISTINCT s.target, s.tenant_id
FROM schedules s JOIN targets g ON g.target = s.target JOIN tenants t ON t.tenant_id = s.tenant_id
WHERE s.tenant_id <> g.owner_tenant;

-- Announce the backfilled bindings, so consumer apps enforce them at once
-- (the format of schemas/target_bindings.py).
INSERT INTO outbox (occurrence_id, tenant_id, topic, message_key, message, scheduled_for, available_at)
SELECT NULL, g.owner_tenant, 'chronoq.target-bindings', convert_to(g.target, 'UTF8'),
       convert_to(json_build_object(
           'format', 1, 'target', g.target,
           'tenants', (SELECT json_agg(t ORDER BY o, t) FROM (
                          SELECT g.owner_tenant AS t, 0 AS o
                          UNION SELECT tg.tenant_id, 1 FROM target_grants tg WHERE tg.target = g.target) m),
           'version', g.version,
           'changed_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text, 'UTF8'),
       now(), now()
FROM targets g;

-- Attempt credentials (issue 10 item 5; the attempt processor verifies them
-- once wired): a secret per (target, consumer group) that the engine issues
-- and a consumer app signs its attempt events with (schemas/attempt_credentials.py).
-- Several live credentials per pair allow rotation without a gap.
CREATE TABLE attempt_credentials (
    credential_id   uuid PRIMARY KEY,
    target          text NOT NULL REFERENCES targets (target),
    consumer_group  text NOT NULL CHECK (length(consumer_group) BETWEEN 1 AND 255),
    secret          bytea NOT NULL CHECK (length(secret) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz
);
CREATE INDEX attempt_credentials_live ON attempt_credentials (target, consumer_group)
    WHERE revoked_at IS NULL;
