"""Migration 0006 on a database that already has schedules: targets in use keep working for every tenant.

The oldest schedule's tenant owns a target, the other tenants already using it are granted it, every
target's binding is queued for the consumer apps, and processed commands become tenant-scoped.
"""

from __future__ import annotations

import uuid

import asyncpg
import orjson

from schemas.migrations import _LEDGER_DDL, apply_migrations, load_migrations
from schemas.target_bindings import decode_target_binding
from tests.support.databases import create_database, drop_database


async def apply_up_to(conn: asyncpg.Connection, version: int) -> None:
    """The engine migrations before ``version``, recorded as the runner records them."""
    await conn.execute(_LEDGER_DDL)
    for migration in load_migrations("engine"):
        if migration.version >= version:
            break
        await conn.execute(migration.sql)
        await conn.execute(
            "INSERT INTO chronoq_migrations (migration_set, version, name, checksum) VALUES ('engine', $1, $2, $3)",
            migration.version,
            migration.name,
            migration.checksum,
        )


async def test_0006_registers_targets_in_use_and_scopes_processed_commands(servers):
    name = f"chronoq_migration_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(await create_database(servers, name))
    try:
        await apply_up_to(conn, 6)
        for tenant in ("acme", "globex"):
            await conn.execute(
                "INSERT INTO tenants (tenant_id, api_token_hash, signing_key) VALUES ($1, $2, $3)",
                tenant,
                uuid.uuid4().bytes,
                b"k" * 32,
            )
        for tenant, target, created in (
            ("acme", "billing", "2026-01-01"),
            ("globex", "billing", "2026-02-01"),
            ("globex", "reports", "2026-03-01"),
        ):
            await conn.execute(
                "INSERT INTO schedules (schedule_id, tenant_id, kind, expression, target, shard, created_at)"
                " VALUES ($1, $2, 'cron', '0 9 * * *', $3, 0, $4::text::timestamptz)",
                uuid.uuid4(),
                tenant,
                target,
                created,
            )
        command_id = uuid.uuid4()
        await conn.execute(
            "INSERT INTO processed_commands (command_id, tenant_id, action, outcome)"
            " VALUES ($1, 'acme', 'create', '{}')",
            command_id,
        )

        assert [m.version for m in await apply_migrations(conn, "engine")][0] == 6  # and the later ones

        owners = {r["target"]: r["owner_tenant"] for r in await conn.fetch("SELECT * FROM targets")}
        assert owners == {"billing": "acme", "reports": "globex"}
        assert [tuple(r) for r in await conn.fetch("SELECT target, tenant_id FROM target_grants")] == [
            ("billing", "globex")
        ]
        bindings = {
            b.target: b
            for b in (
                decode_target_binding(bytes(r["message"]))
                for r in await conn.fetch("SELECT message FROM outbox WHERE topic = 'chronoq.target-bindings'")
            )
        }
        assert bindings["billing"].tenants == ("acme", "globex") and bindings["reports"].tenants == ("globex",)
        # The same command id is now free for another tenant.
        await conn.execute(
            "INSERT INTO processed_commands (command_id, tenant_id, action, outcome)"
            " VALUES ($1, 'globex', 'create', $2)",
            command_id,
            orjson.dumps({}).decode(),
        )
        assert await conn.fetchval("SELECT count(*) FROM processed_commands WHERE command_id = $1", command_id) == 2
    finally:
        await conn.close()
        await drop_database(servers, name)
