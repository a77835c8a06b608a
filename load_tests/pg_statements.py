"""PostgreSQL's time per statement during a benchmark window, from ``pg_stat_statements``.

``process_cpu`` says how much of a burst's CPU PostgreSQL took; this says which statements took it. The
extension must be preloaded: :func:`preload` does that for the embedded server (a restart, before anything
connects); an external server needs ``shared_preload_libraries = 'pg_stat_statements'`` set by its owner.
Times are the statements' execution time (``total_exec_time``, wall clock inside the server, so waits on
locks and the CPU count alike); commits and WAL flushes are outside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:  # the benchmark's worker processes import this module too, and need no server code
    from engine.cli.embedded import EmbeddedPostgres


async def preload(postgres: EmbeddedPostgres) -> None:
    """Preload the extension on the embedded server (restarts it)."""
    await postgres.configure({"shared_preload_libraries": "pg_stat_statements"})


async def reset(conn: asyncpg.Connection) -> None:
    """Create the extension if needed and forget what was counted so far: the window starts now.

    RuntimeError saying what to set when the server did not preload the library."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
    except asyncpg.PostgresError as err:
        raise RuntimeError(
            "pg_stat_statements is not available: set shared_preload_libraries = 'pg_stat_statements' on the"
            f" server and restart it, or run against the embedded stack ({err})"
        ) from err


async def top(conn: asyncpg.Connection, limit: int, databases: list[str]) -> list[dict[str, Any]]:
    """The ``limit`` statements of ``databases`` that took the most execution time since :func:`reset`,
    each with its share of all of them, calls, rows, time per row, buffer hits per row and WAL per row."""
    rows = await conn.fetch(
        """
        WITH s AS (
            SELECT s.* FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = ANY ($2::text[])
        )
        SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 120) AS statement, calls, rows,
               total_exec_time AS total_ms, total_exec_time / nullif(sum(total_exec_time) OVER (), 0) AS share,
               shared_blks_hit, wal_bytes
        FROM s ORDER BY total_exec_time DESC LIMIT $1
        """,
        limit,
        databases,
    )
    return [
        {
            "statement": r["statement"],
            "share": round(r["share"] or 0.0, 3),
            "total_ms": round(r["total_ms"]),
            "calls": r["calls"],
            "rows": r["rows"],
            "us_per_row": round(r["total_ms"] * 1000 / r["rows"], 1) if r["rows"] else None,
            "buffer_hits_per_row": round(r["shared_blks_hit"] / r["rows"], 1) if r["rows"] else None,
            "wal_bytes_per_row": round(int(r["wal_bytes"]) / r["rows"]) if r["rows"] else None,
        }
        for r in rows
    ]
