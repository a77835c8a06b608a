"""Benchmark: next fire time for many schedules sharing few (expression, zone) pairs.

    python -m load_tests.next_fire_benchmark [--schedules 1000000] [--pairs 1000] [--json PATH]

What a materializer does at the top of an hour: for every due schedule,
compute next_fire_after(spec, durable cursor). Schedules are built in memory
(one TimeSpec object per schedule, as the materializer builds one per row),
their cursors sit on a few distinct minute boundaries, and a tenth of them
carry start/end bounds. The run reports schedules per second with the shared
memo, its hit ratio, and the same work without the memo on a sample.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from engine.control.schedule_requests import build_time_spec
from engine.rules import timing

UTC = UTC
ZONES = [
    "UTC",
    "America/New_York",
    "America/Chicago",
    "America/Denver",
    "America/Los_Angeles",
    "America/Sao_Paulo",
    "America/Santiago",
    "America/St_Johns",
    "Europe/London",
    "Europe/Dublin",
    "Europe/Berlin",
    "Europe/Paris",
    "Europe/Moscow",
    "Africa/Cairo",
    "Asia/Beirut",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Asia/Shanghai",
    "Asia/Tokyo",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Auckland",
    "Pacific/Chatham",
]
COMMON = [
    "* * * * *",
    "*/5 * * * *",
    "*/15 * * * *",
    "0 * * * *",
    "0 9 * * MON-FRI",
    "30 2 * * *",
    "0 0 * * *",
    "@daily",
    "@hourly",
    "0 0 1 * *",
    "0 8 * * 1",
    "0 12 29 2 *",
    "0 0 13 * 5",
]


def make_pairs(count: int, rng: random.Random) -> list[tuple[str, str, str, str]]:
    """``count`` distinct (expression, zone, dst_repeat, dst_gap) combinations, all valid."""
    pairs: set[tuple[str, str, str, str]] = set()
    for expression in COMMON:
        for zone in ZONES:
            if len(pairs) < count:
                pairs.add((expression, zone, "first", "skip"))
    while len(pairs) < count:
        minute = rng.choice(["0", "15", "30", "45", "*/10", "5,35", str(rng.randrange(60))])
        hour = rng.choice(["*", "*/2", "9-17", "0", str(rng.randrange(24)), "1,13"])
        dow = rng.choice(["*", "*", "MON-FRI", "1", "0,6"])
        dom = rng.choice(["*", "*", "*", "1", "15", "1,15"])
        repeat, gap = rng.choice([("first", "skip"), ("first", "skip"), ("both", "skip"), ("first", "shift")])
        pairs.add((f"{minute} {hour} {dom} * {dow}", rng.choice(ZONES), repeat, gap))
    return sorted(pairs)


def build_schedules(schedules: int, pairs: int, afters: int, seed: int) -> tuple[list[timing.TimeSpec], list[datetime]]:
    rng = random.Random(seed)
    templates = [build_time_spec("cron", e, z, dst_repeat=r, dst_gap=g) for e, z, r, g in make_pairs(pairs, rng)]
    # A materializer at the top of the hour sees cursors on a few minute boundaries.
    top = datetime(2027, 3, 14, 6, 0, tzinfo=UTC)  # the US spring-forward night
    boundaries = [top + timedelta(minutes=i) for i in range(afters)]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = datetime(2030, 1, 1, tzinfo=UTC)
    specs: list[timing.TimeSpec] = []
    cursors: list[datetime] = []
    for number in range(schedules):
        t = templates[rng.randrange(len(templates))]
        bounded = number % 10 == 0
        specs.append(
            timing.TimeSpec(
                t.kind,
                t.expression,
                t.time_zone,
                t.dst_repeat,
                t.dst_gap,
                None,
                start if bounded else None,
                end if bounded else None,
            )
        )
        cursors.append(boundaries[number % afters])
    return specs, cursors


def run(schedules: int, pairs: int, afters: int, sample: int, seed: int) -> dict[str, object]:
    began = time.perf_counter()
    specs, cursors = build_schedules(schedules, pairs, afters, seed)
    build_seconds = time.perf_counter() - began

    timing.clear_time_caches()
    next_fire_after = timing.next_fire_after
    began = time.perf_counter()
    results = [next_fire_after(spec, cursor) for spec, cursor in zip(specs, cursors, strict=True)]
    cached_seconds = time.perf_counter() - began
    info = timing.next_fire_cache_info()

    rng = random.Random(seed + 1)
    picks = rng.sample(range(schedules), min(sample, schedules))
    timing.clear_time_caches()
    began = time.perf_counter()
    uncached = [next_fire_after(specs[i], cursors[i], cached=False) for i in picks]
    uncached_seconds = time.perf_counter() - began
    mismatches = sum(1 for i, found in zip(picks, uncached, strict=True) if results[i] != found)
    exhausted = sum(1 for r in results if r is None)

    cached_rate = schedules / cached_seconds
    uncached_rate = len(picks) / uncached_seconds
    lookups = info["hits"] + info["misses"]
    return {
        "schedules": schedules,
        "distinct_pairs": pairs,
        "distinct_cursors": afters,
        "build_seconds": round(build_seconds, 3),
        "cached_seconds": round(cached_seconds, 3),
        "cached_schedules_per_second": round(cached_rate),
        "cache_hits": info["hits"],
        "cache_misses": info["misses"],
        "cache_hit_ratio": round(info["hits"] / lookups, 6) if lookups else 0.0,
        "uncached_sample": len(picks),
        "uncached_seconds": round(uncached_seconds, 3),
        "uncached_schedules_per_second": round(uncached_rate),
        "uncached_projected_seconds_for_all": round(schedules / uncached_rate, 1),
        "speedup": round(cached_rate / uncached_rate, 1),
        "mismatches_cached_vs_uncached": mismatches,
        "exhausted": exhausted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--pairs", type=int, default=1000, help="distinct (expression, zone, DST options)")
    parser.add_argument("--afters", type=int, default=4, help="distinct cursor instants (minute boundaries)")
    parser.add_argument("--uncached-sample", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    figures = run(args.schedules, args.pairs, args.afters, args.uncached_sample, args.seed)
    print(
        f"next_fire_after for {figures['schedules']:,} schedules over {figures['distinct_pairs']:,}"
        f" (expression, zone) pairs and {figures['distinct_cursors']} cursor instants"
    )
    print(
        f"  with the shared memo: {figures['cached_seconds']} s = {figures['cached_schedules_per_second']:,}"
        f" schedules/s; hit ratio {figures['cache_hit_ratio']:.4%}"
        f" ({figures['cache_hits']:,} hits, {figures['cache_misses']:,} misses)"
    )
    print(
        f"  without the memo ({figures['uncached_sample']:,}-schedule sample):"
        f" {figures['uncached_schedules_per_second']:,} schedules/s,"
        f" {figures['uncached_projected_seconds_for_all']} s projected for all; memo speed-up"
        f" x{figures['speedup']}"
    )
    print(
        f"  (building the specs took {figures['build_seconds']} s, not counted;"
        f" cached and uncached results differ for {figures['mismatches_cached_vs_uncached']} schedules)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 1 if figures["mismatches_cached_vs_uncached"] else 0


if __name__ == "__main__":
    sys.exit(main())
