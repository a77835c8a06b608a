"""Steady dispatch for a long while: do the data plane's tables stay bounded (issue 12, "a 30-minute run
shows dead tuples and table size bounded")?

    python -m load_tests.soak [--minutes 30] [--schedules 10000] [--every 10s] [--relays 2]
                              [--flexible-fraction 0] [--flexible-window 10]
                              [--broker tansu|apache] [--sample-every 30] [--json PATH] [--png PATH]

Seeds ``--schedules`` rate schedules firing every ``--every`` (10,000 every 10 s: 1,000 occurrences/s,
1.8M in 30 minutes) across 20 tenants, starts ``--relays`` engine nodes (the data plane: materializer on
leased shards, ahead-lane dispatch, settle, late-lane relay, day partitions) and lets them run. Every
``--sample-every`` seconds it records, per table of the hand-off (``dispatch_queue``, ``dispatch_log``,
``outbox``, the cursors and seals) and for ``schedules`` and ``occurrences``: live and dead tuples, total
bytes, autovacuum runs; the age of the oldest due ahead-lane row not yet settled (published or not: the
settle pass defers up to 30 s while pages keep coming, so this is an upper bound of the dispatch lag); and
the rows dispatched since the last sample. No consumer runs: occurrences stay ENQUEUED (their table is
history and grows by design; its retention is ``chronoq history prune``).

Bounded means: a hand-off table's size at the end is at most 1.25 × its largest size in the run's second
quarter (steady state reached), and its dead tuples at the end at most 2 × the second quarter's largest
(autovacuum keeps up). A table that grows with the run (linear growth gives 2 ×) fails. The last stdout
line is one JSON object: ``bounded`` (all tables), per-table ``tables``, ``dispatched_per_s``,
``schedule_lag_p99`` of the last five minutes (strict schedules), ``oldest_unsettled_max_s``, and
``log_rows_per_entry``: occurrences per ``dispatch_log`` entry over the run's second half. A relay logs a
range per shard and second, and within a second per group of rows acknowledged within 50 ms, so strict
rows (all due at the same instant) share entries while flexible ones, spread over their window, cost
about one each; the settled log's size is then about ``keep_log`` × the dispatch rate / this figure.
``--flexible-fraction`` makes that share of the schedules flexible over ``--flexible-window`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from load_tests.hour_top import seed_schedules, seed_tenants, shape, start_nodes, stop_nodes
from schemas.migrations import apply_migrations

HANDOFF_TABLES = ("dispatch_queue", "dispatch_log", "outbox", "dispatch_cursors", "dispatch_seals")
OTHER_TABLES = ("schedules", "occurrences")
TENANTS = 20

_SAMPLE = """
SELECT t.name,
       coalesce(sum(s.n_live_tup), 0)::bigint AS live,
       coalesce(sum(s.n_dead_tup), 0)::bigint AS dead,
       coalesce(sum(pg_total_relation_size(s.relid)), 0)::bigint AS bytes,
       coalesce(sum(s.autovacuum_count), 0)::bigint AS autovacuums
FROM unnest($1::text[]) AS t (name)
LEFT JOIN pg_stat_user_tables s
       ON s.schemaname = 'public' AND (s.relname = t.name OR s.relname ~ ('^' || t.name || '_(p[0-9]{8}|default)$'))
GROUP BY t.name
"""


async def sample(conn: asyncpg.Connection, since: float) -> dict[str, Any]:
    """One sample: every table's figures, the oldest unsettled due row's age, rows dispatched since."""
    tables = {r["name"]: dict(r) for r in await conn.fetch(_SAMPLE, list(HANDOFF_TABLES + OTHER_TABLES))}
    oldest = await conn.fetchval(
        "SELECT extract(epoch FROM now() - min(available_at))::float8 FROM dispatch_queue"
        " WHERE available_at <= now() AND discarded_at IS NULL"
    )
    dispatched = await conn.fetchval(
        "SELECT coalesce(sum(rows), 0)::bigint FROM dispatch_log WHERE acked_at > to_timestamp($1)", since
    )
    return {"at": time.time(), "tables": tables, "oldest_unsettled_s": oldest or 0.0, "dispatched": dispatched}


def verdict(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per hand-off table: sizes and dead tuples at the second quarter, the end and their maximum; bounded?"""
    n = len(samples)
    quarter = samples[n // 4 : max(n // 2, n // 4 + 1)]
    out: dict[str, Any] = {}
    for name in HANDOFF_TABLES + OTHER_TABLES:
        series = [s["tables"][name] for s in samples]
        steady_bytes = max(t["bytes"] for t in (s["tables"][name] for s in quarter))
        steady_dead = max(t["dead"] for t in (s["tables"][name] for s in quarter))
        end = series[-1]
        figures: dict[str, Any] = {
            "bytes_second_quarter_max": steady_bytes,
            "bytes_end": end["bytes"],
            "bytes_max": max(t["bytes"] for t in series),
            "dead_second_quarter_max": steady_dead,
            "dead_end": end["dead"],
            "dead_max": max(t["dead"] for t in series),
            "live_end": end["live"],
            "autovacuums": end["autovacuums"] - series[0]["autovacuums"],
        }
        if name in HANDOFF_TABLES:
            # A few pages of slack: a table of 16 kB that becomes 40 kB has not grown with the run.
            figures["bounded"] = end["bytes"] <= 1.25 * steady_bytes + 65_536 and end["dead"] <= 2 * steady_dead + 1000
        out[name] = figures
    return out


async def run_soak(
    url: str,
    bootstrap: str,
    *,
    minutes: float,
    schedules: int,
    every: str,
    relays: int,
    sample_every: float,
    log_dir: Path,
    partitions: int = 8,
    flexible_fraction: float = 0.0,
    flexible_window: int = 10,
    log: Any = print,
) -> dict[str, Any]:
    """Seed, run the nodes for ``minutes``, sample every ``sample_every`` seconds; the figures (module doc)."""
    conn = await asyncpg.connect(url)
    try:
        await apply_migrations(conn, "engine")
        shards = await conn.fetchval("SELECT count(*)::int FROM shard_leases")
        await seed_tenants(conn, TENANTS)
        now = await conn.fetchval("SELECT now()")
        # The first fire leaves the nodes time to start and lease the shards; the run is measured from it.
        first_fire = now + timedelta(seconds=10)
        flexible = round(schedules * flexible_fraction)
        if schedules - flexible:
            columns = shape("rate", every, "strict", 0, first_fire)
            await seed_schedules(conn, 1, schedules - flexible, columns, 4, shards, 0.5, TENANTS)
        if flexible:
            columns = shape("rate", every, "flexible", flexible_window, first_fire)
            await seed_schedules(conn, schedules - flexible + 1, flexible, columns, 4, shards, 0.5, TENANTS)
        await conn.execute("ANALYZE schedules")
        # The settled dispatch log is kept keep_log seconds (an hour by default, for inspection): a tenth of
        # the run here, so the run reaches its steady state and shows whether the pruning keeps up.
        keep_log = max(60.0, minutes * 6)
        nodes = start_nodes(relays, url, bootstrap, 30.0, partitions, False, log_dir, keep_log=keep_log)
        samples: list[dict[str, Any]] = []
        try:
            await asyncio.sleep(max(0.0, (first_fire - await conn.fetchval("SELECT now()")).total_seconds()))
            began = last = time.time()
            while time.time() - began < minutes * 60:
                await asyncio.sleep(sample_every)
                if any(node.poll() is not None for node in nodes):
                    raise RuntimeError(f"an engine node exited early; see {log_dir}")
                taken = await sample(conn, last)
                last = taken["at"]
                samples.append(taken)
                q = taken["tables"]["dispatch_queue"]
                log(
                    f"{(taken['at'] - began) / 60:5.1f} min: dispatched {taken['dispatched'] / sample_every:,.0f}/s,"
                    f" oldest unsettled {taken['oldest_unsettled_s']:.1f} s,"
                    f" queue {q['live']:,} live {q['dead']:,} dead"
                    f" {q['bytes'] / 2**20:.1f} MB, occurrences {taken['tables']['occurrences']['live']:,}"
                )
        finally:
            stop_nodes(nodes)
        lag = await conn.fetchval(
            "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM o.enqueued_at - o.scheduled_for))"
            " FROM occurrences o JOIN schedules s USING (schedule_id) WHERE s.priority = 'strict'"
            " AND o.scheduled_for > now() - interval '5 minutes' AND o.enqueued_at IS NOT NULL"
        )
        half = samples[len(samples) // 2]["at"] if samples else time.time()
        logged = await conn.fetchrow(
            "SELECT count(*)::bigint AS entries, coalesce(sum(rows), 0)::bigint AS rows FROM dispatch_log"
            " WHERE acked_at > to_timestamp($1)",
            half,
        )
    finally:
        await conn.close()
    if len(samples) < 4:
        raise RuntimeError("too few samples for a verdict: run longer or sample more often")
    tables = verdict(samples)
    steady = samples[len(samples) // 4 :]
    steady_seconds = steady[-1]["at"] - steady[0]["at"] + sample_every
    return {
        "minutes": minutes,
        "schedules": schedules,
        "every": every,
        "relays": relays,
        "samples": samples,
        "tables": tables,
        "bounded": all(t["bounded"] for t in tables.values() if "bounded" in t),
        "dispatched_per_s": round(sum(s["dispatched"] for s in steady) / steady_seconds),
        "oldest_unsettled_max_s": round(max(s["oldest_unsettled_s"] for s in steady), 2),
        "schedule_lag_p99": round(lag, 3) if lag is not None else None,
        "flexible_fraction": flexible_fraction,
        "flexible_window": flexible_window,
        "keep_log_s": keep_log,
        "log_rows_per_entry": round(logged["rows"] / logged["entries"], 2) if logged["entries"] else None,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t0 = samples[0]["at"]
    minutes = [(s["at"] - t0) / 60 for s in samples]
    fig, (sizes, dead) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name in HANDOFF_TABLES:
        sizes.plot(minutes, [s["tables"][name]["bytes"] / 2**20 for s in samples], label=name)
        dead.plot(minutes, [s["tables"][name]["dead"] for s in samples], label=name)
    sizes.set_ylabel("total size (MB)")
    dead.set_ylabel("dead tuples")
    dead.set_xlabel("minutes")
    sizes.legend()
    sizes.set_title(f"soak: {result['schedules']:,} schedules every {result['every']}, {result['relays']} nodes")
    fig.tight_layout()
    fig.savefig(path)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from load_tests.stack_for_load import load_stack

    log_dir = Path(args.log_dir or (Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-{uuid.uuid4().hex[:6]}"))
    log_dir.mkdir(parents=True, exist_ok=True)
    async with load_stack("soak", args.broker) as (url, bootstrap):
        result = await run_soak(
            url,
            bootstrap,
            minutes=args.minutes,
            schedules=args.schedules,
            every=args.every,
            relays=args.relays,
            sample_every=args.sample_every,
            log_dir=log_dir,
            flexible_fraction=args.flexible_fraction,
            flexible_window=args.flexible_window,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    result["broker"] = args.broker
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if args.png:
        plot(result, args.png)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--every", default="10s", help="the rate schedules' interval")
    parser.add_argument("--relays", type=int, default=2, help="engine node processes")
    parser.add_argument("--flexible-fraction", type=float, default=0.0, help="share of flexible schedules")
    parser.add_argument("--flexible-window", type=int, default=10, help="their flexible window (seconds)")
    parser.add_argument("--broker", choices=("tansu", "apache"), default="tansu")
    parser.add_argument("--sample-every", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--log-dir")
    return parser.parse_args(argv)


if __name__ == "__main__":
    summary = asyncio.run(main(parse_args()))
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, default=str), flush=True)
