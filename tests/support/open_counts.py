"""The tenant gate's open-occurrence counter (migration 0027) against the truth, for any test that writes
occurrences."""

from __future__ import annotations

import asyncpg

OPEN_STATES = ("SCHEDULED", "ENQUEUED", "RUNNING", "RETRY_WAIT")


async def open_count_drift(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, tuple[int, int]]:
    """Every tenant whose counter (``chronoq_open_occurrences``: counter plus unfolded changes) differs from a
    count of its open hot occurrences, as ``{tenant: (counter, counted)}``; empty when all agree. One
    statement, so both sides read one snapshot."""
    rows = await conn.fetch(
        """
        WITH counted AS (
            SELECT tenant_id, count(*) AS n FROM occurrences WHERE state = ANY ($1::text[]) GROUP BY tenant_id
        ), seen AS (
            SELECT tenant_id FROM counted
            UNION SELECT tenant_id FROM tenant_usage
            UNION SELECT tenant_id FROM tenant_usage_changes
        )
        SELECT s.tenant_id, chronoq_open_occurrences(s.tenant_id) AS counter, coalesce(c.n, 0) AS counted
        FROM seen s LEFT JOIN counted c ON c.tenant_id = s.tenant_id
        WHERE chronoq_open_occurrences(s.tenant_id) <> coalesce(c.n, 0)
        """,
        list(OPEN_STATES),
    )
    return {r["tenant_id"]: (r["counter"], r["counted"]) for r in rows}
