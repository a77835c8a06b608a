"""What the attempt processor's occurrence UPDATE costs, with the indexes it has and without the ones that make
it non-HOT (an experiment for issue 16's storage question, not a change of the schema).

Every ``started`` and every outcome rewrites its occurrence's row (``update_occurrences``: ENQUEUED → RUNNING
→ SUCCEEDED), and in the consumer burst that statement is about half of PostgreSQL's time. None of these
updates can be HOT (heap-only: no new index entries): ``state`` is in the predicate of five partial indexes
(open, finished by tenant, dead, enqueued since, lease expiry) and ``updated_at`` and ``lease_expires_at`` are
indexed, so each update writes a new tuple into every index. This tool measures the same statement, in the
same batches, on three layouts of a fresh engine database:

* ``indexed``: the schema as migrated;
* ``hot80``: without those five indexes, day partitions at fillfactor 80;
* ``hot50``: the same at fillfactor 50 (room on each page for a second version of every row).

It prints one JSON line per layout (µs and WAL bytes per row for each of the two updates, the share of HOT
updates) and, last, all of them as one object. The embedded PostgreSQL is started and stopped by the tool.

    python -m load_tests.occurrence_updates --rows 40000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from schemas.migrations import apply_migrations
from schemas.queries import QUERIES

DAY = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
#: The indexes whose columns (state in their predicates, lease_expires_at, updated_at) every such update changes.
NON_HOT_INDEXES = (
    "occurrences_dead",
    "occurrences_enqueued_since",
    "occurrences_finished_by_tenant",
    "occurrences_lease_expiry",
    "occurrences_open",
)
LAYOUTS = {"indexed": None, "hot80": 80, "hot50": 50}


def _changes(ids: list[uuid.UUID], state: str) -> str:
    """The JSON recordset update_occurrences takes, as the attempt processor builds it for a batch."""
    running = state == "RUNNING"
    return json.dumps(
        [
            {
                "occurrence_id": str(oid),
                "state": state,
                "attempt_count": 1,
                "lease_token": str(uuid.uuid4()) if running else None,
                "lease_expires_at": (DAY + timedelta(seconds=30)).isoformat() if running else None,
                "enqueued_at": DAY.isoformat(),
                "finished_at": None if running else DAY.isoformat(),
                "last_error_class": None,
                "last_error_message": None,
                "dead_reason": None,
            }
            for oid in ids
        ]
    )


async def measure(url: str, layout: str, rows: int, batch: int) -> dict[str, Any]:
    """Migrate a fresh database at ``url``, shape it as ``layout``, write ``rows`` ENQUEUED occurrences and
    time the two updates of each (RUNNING, then SUCCEEDED) in batches of ``batch``, one transaction each."""
    conn = await asyncpg.connect(url)
    try:
        await apply_migrations(conn, "engine")
        await conn.execute("SELECT chronoq_ensure_day_partitions($1::date, $1::date)", DAY.date())
        fillfactor = LAYOUTS[layout]
        if fillfactor is not None:
            for name in NON_HOT_INDEXES:
                await conn.execute(f"DROP INDEX {name}")  # noqa: S608 - the names are the constants above
            for part in await conn.fetch(
                "SELECT inhrelid::regclass::text AS name FROM pg_inherits WHERE inhparent = 'occurrences'::regclass"
            ):
                await conn.execute(f"ALTER TABLE {part['name']} SET (fillfactor = {fillfactor})")
        ids = [uuid.uuid4() for _ in range(rows)]
        await conn.copy_records_to_table(
            "occurrences",
            records=[
                (oid, uuid.uuid4(), 1, f"tenant-{n % 50}", "bench.noop", DAY, DAY, "ENQUEUED", DAY, DAY, DAY)
                for n, oid in enumerate(ids)
            ],
            columns=[
                "occurrence_id", "schedule_id", "schedule_version", "tenant_id", "target", "scheduled_for",
                "available_at", "state", "created_at", "updated_at", "enqueued_at",
            ],
        )  # fmt: skip
        await conn.execute("VACUUM ANALYZE occurrences")
        await conn.execute("CHECKPOINT")  # every layout starts with the same full-page-image state
        result: dict[str, Any] = {"layout": layout, "rows": rows}
        for step, state in (("started", "RUNNING"), ("succeeded", "SUCCEEDED")):
            wal_before = await conn.fetchval("SELECT pg_current_wal_lsn()")
            started = time.perf_counter()
            for at in range(0, rows, batch):
                chunk = ids[at : at + batch]
                async with conn.transaction():
                    await conn.execute(
                        *QUERIES.update_occurrences(
                            occurrences=_changes(chunk, state), occurrence_ids=chunk, days=[DAY], now=DAY
                        )
                    )
            elapsed = time.perf_counter() - started
            wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", wal_before)
            result[step] = {"us_per_row": round(elapsed / rows * 1e6, 1), "wal_bytes_per_row": round(float(wal) / rows)}
        # This backend's counts reach the shared statistics when its next transaction ends.
        await conn.execute("SELECT pg_stat_force_next_flush()")
        counts = await conn.fetchrow(
            "SELECT coalesce(sum(n_tup_upd), 0) AS updates, coalesce(sum(n_tup_hot_upd), 0) AS hot"
            " FROM pg_stat_user_tables WHERE relname LIKE 'occurrences%'"
        )
        result["hot_share"] = round(int(counts["hot"]) / max(int(counts["updates"]), 1), 3)
        return result
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from engine.cli.embedded.postgres import EmbeddedPostgres

    postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="chronoq-occurrence-updates-")) / "postgres")
    await asyncio.get_running_loop().run_in_executor(None, postgres.start)
    results: dict[str, Any] = {}
    try:
        admin = await asyncpg.connect(postgres.url("postgres"))
        try:
            for layout in args.layouts:
                name = f"occurrence_updates_{layout}"
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
                await admin.execute(f'CREATE DATABASE "{name}"')
                try:
                    results[layout] = await measure(postgres.url(name), layout, args.rows, args.batch)
                finally:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                print(json.dumps(results[layout]), flush=True)
        finally:
            await admin.close()
    finally:
        postgres.stop()
    return results


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=40_000, help="occurrences updated twice each")
    parser.add_argument("--batch", type=int, default=500, help="rows per statement and transaction")
    parser.add_argument("--layouts", nargs="+", choices=tuple(LAYOUTS), default=list(LAYOUTS))
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse()))))
