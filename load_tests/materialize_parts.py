"""What each part of the materializer's statement costs per occurrence (an experiment for issue 12's storage
question, not a change of the schema).

A materializer pass writes, per due schedule and in one statement (``materialize_staged``): the cursor
advance of the wide ``schedules`` row (a compare-and-set on version and cursor; ``next_run_at`` is indexed,
so the update is not HOT and writes an entry into each of the table's five indexes), the occurrence row
(SCHEDULED, eight index entries) and its ahead-lane row. Issue 12 asks for 50,000 occurrences/s on two cores,
~40 µs of CPU per occurrence for everything (PostgreSQL and Python). This tool runs, on one connection of a
fresh engine database with B background schedules, batches of due schedules COPYed into the materializer's
staging table as a pass does, through these statements, interleaved so that the table's growth is shared:

* ``as_built``: the materializer's own statement, as a pass runs it first (unchecked: no speculative insert);
* ``as_built_checked``: the same, checked (``ON CONFLICT DO NOTHING``: how a pass runs it again after a conflict,
  and how every pass ran it before stop 58);
* ``as_built_by_id``: the same with the batch in schedule-id order (every other variant takes its batch in a
  pass's order: by shard, the ids in random order within one);
* ``cursor_only``: the cursor advance of the wide row alone (what a write-once design still pays per schedule);
* ``narrow_cursor``: the cursor advanced on a narrow copy of the cursor columns (``schedule_id, shard,
  next_run_at, version, state``, its key and the due index) instead, plus both inserts;
* ``no_cursor``: the occurrence and ahead-lane inserts without any per-schedule cursor write (what a cursor
  kept once per (expression, zone) group would leave);
* ``ahead_only``: the ahead-lane row alone (no occurrence row until the relay's settle, no cursor write).

It prints one line per batch and, last, one JSON object: per variant µs and WAL bytes per row of the
statement, and the COPY's µs per row. The embedded PostgreSQL is started and stopped by the tool.

    python -m load_tests.materialize_parts --background 1000000 --batch 15000 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from load_tests.hour_top import seed_schedules, seed_tenants, shape
from schemas.dispatch_lanes import micros_of
from schemas.migrations import apply_migrations
from schemas.queries import QUERIES
from schemas.topics import occurrence_topic, schedule_key

VARIANTS = ("as_built", "as_built_checked", "as_built_by_id", "cursor_only", "narrow_cursor", "no_cursor", "ahead_only")
_STAGED = (
    "occurrence_id", "schedule_id", "schedule_version", "tenant_id", "target", "scheduled_us", "available_us",
    "state", "topic", "message_key", "message", "held", "ahead", "shard", "lane", "bucket_us", "wrr_round",
    "late_after_us", "misfire_policy", "tenant_held",
)  # fmt: skip


def _product_inserts() -> str:
    """The occurrence and ahead-lane inserts of the materializer's own statement (``materialize_staged``), cut
    from it rather than copied, so the variants measure what the product writes; its ``$1`` is ``:now``, as in
    every variant below. A change of that statement's layout fails here, at import."""
    query = QUERIES.materialize_staged
    if query.params[0] != "now":
        raise RuntimeError("materialize_staged no longer takes :now first: update load_tests/materialize_parts.py")
    inserts = query.sql.split("), new_occurrences AS NOT MATERIALIZED (", 1)[1].split("), late AS (", 1)[0]
    # The occurrences inserted as a pass inserts them first: unchecked (no speculative insert).
    checked = f"${query.params.index('checked') + 1}::boolean"
    if inserts.count(checked) != 2:
        raise RuntimeError("materialize_staged's :checked changed: update load_tests/materialize_parts.py")
    inserts = inserts.replace(checked, "false")
    # The variants' schedules have their own cursors: the rows of the schedules advanced, no cohort's.
    product = (
        "WHERE m.schedule_id IN (SELECT schedule_id FROM moved)\n"
        "       OR m.cohort_id IN (SELECT cohort_id FROM cohorts_advanced)"
    )
    if product not in inserts:
        raise RuntimeError("materialize_staged's insert condition changed: update load_tests/materialize_parts.py")
    inserts = inserts.replace(product, "WHERE m.schedule_id IN (SELECT schedule_id FROM advanced)")
    return "new_occurrences AS NOT MATERIALIZED (" + inserts + ")\nSELECT (SELECT count(*) FROM inserted) AS written"


_INSERTS = _product_inserts()

# Every variant takes $1 now (NULL: the server's), $2 schedule ids, $3 their cursors as read, $4 the next ones.
_STATEMENTS = {
    "cursor_only": """
WITH advanced AS (
    UPDATE schedules s
    SET next_run_at = u.next_run_at, runs = s.runs + 1, updated_at = coalesce($1::timestamptz, now())
    FROM unnest($2::uuid[], $3::timestamptz[], $4::timestamptz[]) AS u (schedule_id, cursor, next_run_at)
    WHERE s.schedule_id = u.schedule_id AND s.version = 1 AND s.state = 'active' AND s.next_run_at = u.cursor
    RETURNING s.schedule_id
)
SELECT count(*) AS written FROM advanced""",
    "narrow_cursor": """
WITH advanced AS (
    UPDATE schedule_cursors s
    SET next_run_at = u.next_run_at
    FROM unnest($2::uuid[], $3::timestamptz[], $4::timestamptz[]) AS u (schedule_id, cursor, next_run_at)
    WHERE s.schedule_id = u.schedule_id AND s.version = 1 AND s.state = 'active' AND s.next_run_at = u.cursor
    RETURNING s.schedule_id
), """
    + _INSERTS,
    "no_cursor": """
WITH advanced AS (
    SELECT u.schedule_id FROM unnest($2::uuid[], $3::timestamptz[], $4::timestamptz[]) AS u (schedule_id, cursor, n)
), """
    + _INSERTS,
    "ahead_only": """
WITH ahead AS (
    INSERT INTO dispatch_queue (shard, lane, bucket, wrr_round, occurrence_id, tenant_id, topic, message_key,
                                message, scheduled_for, available_at, late_after, misfire_policy)
    SELECT m.shard, m.lane, timestamptz 'epoch' + m.bucket_us * interval '1 microsecond', m.wrr_round,
           m.occurrence_id, m.tenant_id, m.topic, m.message_key, m.message,
           timestamptz 'epoch' + m.scheduled_us * interval '1 microsecond',
           timestamptz 'epoch' + m.available_us * interval '1 microsecond',
           timestamptz 'epoch' + m.late_after_us * interval '1 microsecond', m.misfire_policy
    FROM materialize_staging m
    JOIN unnest($2::uuid[], $3::timestamptz[], $4::timestamptz[]) AS u (schedule_id, cursor, n)
      ON u.schedule_id = m.schedule_id
    WHERE m.ahead AND $1::timestamptz IS NULL  -- now: unused here, taken so that every variant has the same arguments
    RETURNING 1
)
SELECT count(*) AS written FROM ahead""",
}

_NARROW_TABLE = """
CREATE TABLE schedule_cursors AS SELECT schedule_id, shard, next_run_at, version, state FROM schedules;
ALTER TABLE schedule_cursors ADD PRIMARY KEY (schedule_id);
CREATE INDEX schedule_cursors_due ON schedule_cursors (shard, next_run_at) WHERE state = 'active';
ANALYZE schedule_cursors;
"""

#: An occurrence message of the size the materializer writes (~400 bytes): the statement copies it, never reads it.
_MESSAGE = b'{"format":1,"payload":{"n":1},"pad":"' + b"x" * 360 + b'"}'


async def seed(conn: asyncpg.Connection, background: int, due: int) -> datetime:
    """Tenants, background schedules not due, then ``due`` schedules all due at one instant (returned);
    and the narrow cursor table, a copy of the cursor columns."""
    now: datetime = await conn.fetchval("SELECT now()")
    await seed_tenants(conn, 100)
    await seed_schedules(
        conn, 1, background, shape("cron", "30 * * * *", "strict", 0, now), 1, 256, 0.5, 100, cohorts=False
    )
    columns = shape("cron", "0 * * * *", "strict", 0, now)
    await seed_schedules(conn, background + 1, due, columns, 1, 256, 0.5, 100, cohorts=False)
    await conn.execute("ANALYZE schedules")
    await conn.execute(_NARROW_TABLE)
    await conn.execute("CHECKPOINT")
    fire: datetime = columns["next_run_at"]
    return fire


def _staged(rows: Sequence[asyncpg.Record], fire: datetime) -> list[tuple[Any, ...]]:
    """Staging rows as a pass COPYs them (ahead, SCHEDULED, strict lane)."""
    target = "load.target-0"  # the one target seed_schedules gives them
    fire_us = micros_of(fire)  # instants staged as the materializer stages them: epoch microseconds
    topic, late_after_us = occurrence_topic(target), micros_of(fire + timedelta(minutes=1))
    return [
        (uuid.uuid4(), r["schedule_id"], 1, r["tenant_id"], target, fire_us, fire_us, "SCHEDULED", topic,
         schedule_key(r["schedule_id"]), _MESSAGE, False, True, r["shard"], "strict", fire_us, 0, late_after_us,
         "fire_once", False)
        for r in rows
    ]  # fmt: skip


async def _run(conn: asyncpg.Connection, variant: str, ids: list[uuid.UUID], fire: datetime) -> int:
    nxt = fire + timedelta(hours=1)
    if variant.startswith("as_built"):
        n = len(ids)
        written = await conn.fetchrow(
            *QUERIES.materialize_staged(
                schedule_ids=ids, versions=[1] * n, cursors=[fire] * n, next_run_ats=[nxt] * n, runs=[1] * n,
                join_cohort_ids=[None] * n, join_cohort_bases=[None] * n, cohort_ids=[], cohort_versions=[],
                cohort_cursors=[], cohort_next_run_ats=[], cohort_fires=[], dissolve_ids=[], dissolve_versions=[],
                dissolve_cursors=[], released_ids=[], released_next_run_ats=[], released_runs=[],
                range_schedule_ids=[], range_versions=[], range_firsts=[], range_lasts=[], range_counts=[],
                gate_token=uuid.uuid4(), tenant_token=uuid.uuid4(), now=None, checked=variant == "as_built_checked",
            )
        )  # fmt: skip
        return int(written["occurrences"])
    count: int = await conn.fetchval(_STATEMENTS[variant], None, ids, [fire] * len(ids), [nxt] * len(ids))
    return count


async def measure(url: str, background: int, batch: int, rounds: int, quiet: bool = False) -> dict[str, Any]:
    """Seed a migrated engine database at ``url`` and run ``rounds`` batches of ``batch`` due schedules through
    each variant (interleaved); per variant: µs and WAL bytes per row of the statement, µs per row of the COPY."""
    conn = await asyncpg.connect(url)
    try:
        fire = await seed(conn, background, batch * rounds * len(VARIANTS))
        due = await conn.fetch("SELECT schedule_id, tenant_id, shard FROM schedules WHERE next_run_at = $1", fire)
        random.Random(7).shuffle(due)
        await conn.execute(*QUERIES.create_staging())
        totals = {v: {"rows": 0, "statement_s": 0.0, "copy_s": 0.0, "wal_bytes": 0} for v in VARIANTS}
        for index in range(rounds * len(VARIANTS)):
            variant = VARIANTS[index % len(VARIANTS)]
            rows = due[index * batch : (index + 1) * batch]
            # a pass's order: shard by shard (its due read), the ids in random order within one
            rows = sorted(rows, key=lambda r: r["schedule_id"] if variant == "as_built_by_id" else r["shard"])
            staged, ids = _staged(rows, fire), [r["schedule_id"] for r in rows]
            before = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
            async with conn.transaction():
                started = time.perf_counter()
                await conn.copy_records_to_table("materialize_staging", records=staged, columns=_STAGED)
                copied = time.perf_counter()
                written = await _run(conn, variant, ids, fire)
                done = time.perf_counter()
            wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", before)
            if written != len(rows):
                raise RuntimeError(f"{variant}: wrote {written} of {len(rows)} rows")
            total = totals[variant]
            total["rows"] += len(rows)
            total["statement_s"] += done - copied
            total["copy_s"] += copied - started
            total["wal_bytes"] += int(wal)
            if not quiet:
                print(
                    f"{variant:>13}: statement {1e6 * (done - copied) / len(rows):6.1f} µs/row, "
                    f"WAL {int(wal) / len(rows):6.0f} B/row",
                    flush=True,
                )
    finally:
        await conn.close()
    return {
        variant: {
            "rows": t["rows"],
            "statement_us_per_row": round(1e6 * t["statement_s"] / t["rows"], 1),
            "copy_us_per_row": round(1e6 * t["copy_s"] / t["rows"], 1),
            "wal_bytes_per_row": round(t["wal_bytes"] / t["rows"]),
        }
        for variant, t in totals.items()
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from engine.cli.embedded.postgres import EmbeddedPostgres

    loop = asyncio.get_running_loop()
    # Its data directory goes with it: a run of two million schedules leaves ~2.5 GB behind otherwise.
    with tempfile.TemporaryDirectory(prefix="chronoq-materialize-parts-") as folder:
        postgres = EmbeddedPostgres(Path(folder) / "postgres")
        await loop.run_in_executor(None, postgres.start)
        try:
            admin = await asyncpg.connect(postgres.url("postgres"))
            try:
                await admin.execute("CREATE DATABASE materialize_parts")
            finally:
                await admin.close()
            url = postgres.url("materialize_parts")
            conn = await asyncpg.connect(url)
            try:
                await apply_migrations(conn, "engine")
            finally:
                await conn.close()
            return await measure(url, args.background, args.batch, args.rounds)
        finally:
            await loop.run_in_executor(None, postgres.stop)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--background", type=int, default=1_000_000, help="schedules not due")
    parser.add_argument("--batch", type=int, default=15_000, help="due schedules per statement (a pass)")
    parser.add_argument("--rounds", type=int, default=4, help="batches per variant")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse()))))
