"""How every chronoq component connects to PostgreSQL.

One place sets the codecs (jsonb and json as Python objects through orjson) so
the engine, the relay and consumer apps read the same types.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg
import orjson

from schemas.start_retries import retry_until_ready


async def _init_connection(conn: asyncpg.Connection) -> None:
    for type_name in ("jsonb", "json"):
        await conn.set_type_codec(
            type_name,
            schema="pg_catalog",
            encoder=lambda value: orjson.dumps(value).decode(),
            decoder=orjson.loads,
            format="text",
        )


def json_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows for a query's ``jsonb_to_recordset(:rows::text::jsonb)``: one JSON array, one object per row, keyed
    by column. One C call for the whole batch where a dozen parallel arrays cost asyncpg several microseconds
    per value; UUIDs of any kind and aware datetimes come out as PostgreSQL reads them."""
    return orjson.dumps(rows, default=str).decode()


T = TypeVar("T")


async def unchecked_first(conn: asyncpg.Connection, run: Callable[[bool], Awaitable[T]]) -> tuple[T, bool]:
    """``run(checked)`` in the open transaction, unchecked first (a plain insert: no speculative ``ON CONFLICT``
    probes per row) under a savepoint; a row that exists already refuses it with unique_violation, the
    savepoint undoes it, and ``run(True)`` writes what the checked statement alone would have. Returns its
    result and whether the checked run was needed (docs/benchmarks.md, stop 58)."""
    try:
        async with conn.transaction():  # a savepoint: the caller's transaction is already open
            return await run(False), False
    except asyncpg.UniqueViolationError:
        pass
    return await run(True), True


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10, **kwargs: Any) -> asyncpg.Pool:
    """A connection pool with chronoq's codecs installed on every connection."""
    return await asyncpg.create_pool(url, min_size=min_size, max_size=max_size, init=_init_connection, **kwargs)


async def create_pool_when_ready(
    url: str,
    stop: asyncio.Event,
    log: logging.Logger,
    *,
    min_size: int = 1,
    max_size: int = 10,
    backoff: float = 0.2,
    backoff_max: float = 5.0,
    **kwargs: Any,
) -> asyncpg.Pool | None:
    """:func:`create_pool` for a long-running process: a transient refusal (too many clients, the server
    starting or shutting down, the connection refused or lost) is logged and retried with capped backoff
    instead of ending the process, so a restart into a busy or restarting database waits for it. Returns
    None when ``stop`` is set first; anything not transient (a wrong password, no such database) is raised."""
    return await retry_until_ready(
        lambda: create_pool(url, min_size=min_size, max_size=max_size, **kwargs),
        stop,
        log,
        step="open the database pool",
        action="database.connect_retry",
        backoff=backoff,
        backoff_max=backoff_max,
    )


async def connect(url: str) -> asyncpg.Connection:
    """A single connection with chronoq's codecs installed."""
    conn = await asyncpg.connect(url)
    await _init_connection(conn)
    return conn
