"""A consumer app started while its database or its broker is unreachable waits for it instead of exiting.

Found by the chaos run: a consumer app restarted while the database dropped its
connections died in ``apply_migrations``. A TCP gate in front of the real
PostgreSQL refuses every connection at first (each is cut at once, as a
restarting server does), then lets them through. The same for the broker:
found by the broker-kill test, whose app died when Apache Kafka was killed
while the app was starting its producer (after creating its topics).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from tests.support.tcp_gate import Gate


def quick_app(bootstrap: str, database_url: str, target: str) -> ConsumerApp:
    """An app with one no-op handler for ``target``, short group timers and no attempt barrier (no attempt
    processor runs in these tests: nobody answers started)."""
    app = ConsumerApp(
        ConsumerConfig(
            f"group-{uuid.uuid4().hex[:8]}",
            bootstrap,
            database_url,
            attempt_barrier=False,
            redelivery_backoff=0.05,
            redelivery_backoff_max=0.2,
            session_timeout=2.0,
            heartbeat_interval=0.4,
        )
    )

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:  # pragma: no cover - not reached
        pass

    return app


async def stop_all(starting: asyncio.Task, app: ConsumerApp, gate: Gate) -> None:
    """Cancel a start still under way, then stop the app and the gate."""
    if not starting.done():
        starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    await app.stop()
    await gate.stop()


async def test_an_app_started_before_its_database_accepts_connections_waits_and_then_runs(
    consumer_db, kafka_bootstrap, target, caplog
):
    gate = Gate(consumer_db)
    gated_url = await gate.start()
    app = quick_app(kafka_bootstrap, gated_url, target)

    caplog.set_level(logging.WARNING, logger="chronoq.consumer")
    starting = asyncio.create_task(app.start())
    try:
        while gate.refused < 3:  # the app keeps trying; it has not given up
            assert not starting.done(), starting.exception()
            await asyncio.sleep(0.02)
        assert any(getattr(r, "action", None) == "consumer.start_retry" for r in caplog.records)
        gate.open = True
        await asyncio.wait_for(starting, 30)  # then it migrates its database and joins the group
        conn = await asyncpg.connect(consumer_db)
        try:
            assert await conn.fetchval("SELECT to_regclass('chronoq_consumer_dedupe') IS NOT NULL")
        finally:
            await conn.close()
    finally:
        await stop_all(starting, app, gate)


async def test_a_misconfigured_database_url_is_not_retried(consumer_db, kafka_bootstrap, target):
    parts = urlsplit(consumer_db)
    missing = urlunsplit(parts._replace(path=f"/no_such_database_{uuid.uuid4().hex[:8]}"))
    app = ConsumerApp(ConsumerConfig(f"group-{uuid.uuid4().hex[:8]}", kafka_bootstrap, missing))

    @app.handler(target)
    async def apply(occurrence: Occurrence, conn: asyncpg.Connection) -> None:  # pragma: no cover - not reached
        pass

    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await asyncio.wait_for(app.start(), 10)
    await app.stop()


async def test_an_app_whose_broker_cuts_its_connections_after_the_topics_exist_waits_and_then_runs(
    consumer_db, kafka_bootstrap, target, caplog
):
    """Every broker step of the start is retried, not only the first: here the topics are created through the
    gate (its first connection), then the next connections (the producer's bootstrap, the views' ...) are cut
    as a restarting broker cuts them. The app keeps trying and then consumes."""
    host, port = kafka_bootstrap.rsplit(":", 1)
    gate = Gate(f"postgresql://x@{host}:{port}/x")  # a TCP gate: only its upstream address is used
    gate.open, gate.cut = True, {2, 3, 4}
    gated = await gate.start()
    bootstrap = urlsplit(gated).netloc.split("@")[-1]
    app = quick_app(bootstrap, consumer_db, target)

    caplog.set_level(logging.WARNING, logger="chronoq.consumer")
    starting = asyncio.create_task(app.start())
    try:
        await asyncio.wait_for(starting, 60)
        assert gate.refused == 3
        assert any(getattr(r, "action", None) == "consumer.start_retry" for r in caplog.records)
        assert app._consumer is not None  # it joined its group
    finally:
        await stop_all(starting, app, gate)
