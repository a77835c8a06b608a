"""A consumer app whose handler records each occurrence it runs in an ``effects`` table, for tests of the
runtime's own checks on made-up occurrences (hostile records, target bindings)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg

from consumers import ConsumerApp, ConsumerConfig, Occurrence


@contextlib.asynccontextmanager
async def effects_table(consumer_db: str) -> AsyncIterator[asyncpg.Connection]:
    """The ``effects`` table in the consumer's database, and a connection to read it."""
    conn = await asyncpg.connect(consumer_db)
    await conn.execute("CREATE TABLE effects (occurrence_id uuid, tenant text)")
    yield conn
    await conn.close()


def effect_app(
    consumer_db: str, kafka_bootstrap: str, target: str, *, binding_wait: float = 1.0, **config: object
) -> ConsumerApp:
    """An app of a fresh group on ``target`` that inserts (occurrence_id, tenant) into ``effects``."""
    app = ConsumerApp(
        ConsumerConfig(
            f"group-{uuid.uuid4().hex[:8]}",
            kafka_bootstrap,
            consumer_db,
            redelivery_backoff=0.05,
            session_timeout=2.0,
            heartbeat_interval=0.4,
            binding_wait=binding_wait,
            # Occurrences made up here, unknown to any engine: nobody would grant them (the barrier refuses an
            # occurrence the engine does not know); what is tested is the runtime's own checks.
            attempt_barrier=False,
            **config,  # type: ignore[arg-type]
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO effects VALUES ($1, $2)", occurrence.occurrence_id, occurrence.tenant_id)

    return app
