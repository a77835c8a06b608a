"""The tenant gate's open-occurrence counter (migration 0027) against the truth, for any test that writes
occurrences."""

from __future__ import annotations

import asyncpg

from schemas.queries import QUERIES


async def open_count_drift(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, tuple[int, int]]:
    """Every tenant whose counter differs from a count of its open hot occurrences, as
    ``{tenant: (counter, counted)}``; empty when all agree (query ``open_count_drift``)."""
    rows = await conn.fetch(*QUERIES.open_count_drift())
    return {r["tenant_id"]: (r["counter"], r["counted"]) for r in rows}
