"""The API process's site (JSON API, console, metrics) with the materializer, as ``run_services`` wires them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from engine.api.server import bind
from engine.loops.materializer import MaterializerConfig
from engine.loops.service import Role
from schemas.connections import create_pool
from tests.support.services import fast_services, services_running


@dataclass
class RunningSite:
    url: str
    pool: asyncpg.Pool  # the test's own pool on the same database


@contextlib.asynccontextmanager
async def console_site(engine_db: str, kafka_bootstrap: str, materialize: bool = True) -> AsyncIterator[RunningSite]:
    sock = bind("127.0.0.1", 0)
    roles = frozenset({Role.API, Role.GAUGES} | ({Role.MATERIALIZER} if materialize else set()))
    config = fast_services(
        roles=roles, api_socket=sock, materializer=MaterializerConfig(horizon=timedelta(seconds=2), idle_interval=0.1)
    )
    pool = await create_pool(engine_db, min_size=1, max_size=4)
    try:
        async with services_running(engine_db, kafka_bootstrap, config):
            yield RunningSite(f"http://127.0.0.1:{sock.getsockname()[1]}", pool)
    finally:
        await pool.close()
