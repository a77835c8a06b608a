"""A long-running process opening its pool while the database refuses connections waits for it.

Why: in the chaos run, engine processes restarted while the server had no connection slot left ("sorry, too
many clients already", SQLSTATE 53300) exited instead of waiting, seven times in four minutes. The refusal is
transient; the process must retry it, and still fail at once on what no retry fixes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from schemas.connections import create_pool_when_ready
from tests.support.waiting import wait_for

log = logging.getLogger("test.connect_retry")


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest.fixture
async def capped_role(servers):
    """A login role allowed no connection at all for now (as if the server were full): its name."""
    role = f"capped_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(servers.admin_url)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
        yield role
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def test_a_pool_waits_for_a_connection_slot_and_opens_once_there_is_one(servers, engine_db, capped_role, caplog):
    url = as_role(engine_db, capped_role)
    with pytest.raises(asyncpg.TooManyConnectionsError):
        await asyncpg.connect(url)  # what the process saw
    caplog.set_level(logging.WARNING, logger=log.name)
    opening = asyncio.create_task(create_pool_when_ready(url, asyncio.Event(), log, backoff=0.05, backoff_max=0.2))
    await wait_for(lambda: any(getattr(r, "action", None) == "database.connect_retry" for r in caplog.records), 10)
    assert not opening.done()
    admin = await asyncpg.connect(servers.admin_url)
    try:
        await admin.execute(f'ALTER ROLE "{capped_role}" CONNECTION LIMIT -1')
    finally:
        await admin.close()
    pool = await asyncio.wait_for(opening, 10)
    assert pool is not None
    try:
        assert await pool.fetchval("SELECT current_user") == capped_role
    finally:
        await pool.close()


async def test_stop_while_waiting_returns_no_pool(engine_db, capped_role):
    stop = asyncio.Event()
    opening = asyncio.create_task(
        create_pool_when_ready(as_role(engine_db, capped_role), stop, log, backoff=0.05, backoff_max=0.2)
    )
    await asyncio.sleep(0)  # let it try once
    stop.set()
    assert await asyncio.wait_for(opening, 10) is None


async def test_what_no_retry_fixes_is_raised_at_once(servers):
    missing = servers.url(f"no_such_database_{uuid.uuid4().hex[:8]}")
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await asyncio.wait_for(create_pool_when_ready(missing, asyncio.Event(), log), 10)
