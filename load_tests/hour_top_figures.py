"""What an hour-top run measured (``load_tests.hour_top``): lag percentiles overall, per lane and per tenant
size class, how flexible work spread over its window, what each reader of Kafka missed, the dispatch rate and
its fraction of the floor, the summary line and the PNG. Pure apart from writing the PNG: the run hands it
rows and readings."""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from load_tests.raw_floor import fastest_pipeline

BIG_TENANT = "big"


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def lease_health(log_lines: list[str]) -> dict[str, Any]:
    """What the nodes' logs say about their shard leases: rounds that found shards taken by another node
    (``losses``: each one means the new owner republishes what was handed over but not logged), renewals
    later than half the ttl, and the longest such gap with where it went (the engine's
    ``shard.renewal_late`` warning: connection wait, statements, the rest the node's event loop)."""
    late = [line for line in log_lines if "action=shard.renewal_late" in line]
    worst = max(late, key=lambda line: _field(line, "gap_s"), default=None)
    return {
        "losses": sum("action=shard.lost" in line for line in log_lines),
        "late_renewals": len(late),
        "worst_gap": None
        if worst is None
        else {name: _field(worst, name) for name in ("gap_s", "connection_wait_s", "statements_s")},
    }


def loop_stalls(log_lines: list[str]) -> dict[str, Any]:
    """The nodes' event-loop stalls (``loop.stalled``: a wake-up later than half a second) and the longest, with
    how much of it the garbage collector took (the rest: the node's own synchronous work) and the oldest
    generation it collected (None: no collection in it)."""
    stalls = [line for line in log_lines if "action=loop.stalled" in line]
    worst = max(stalls, key=lambda line: _field(line, "lag_s"), default=None)
    return {
        "stalls": len(stalls),
        "worst": None
        if worst is None
        else {
            name: None if math.isnan(value := _field(worst, name)) else value
            for name in ("lag_s", "gc_s", "gc_generation")
        },
    }


def _field(line: str, name: str) -> float:
    """The number a ``name=value`` pair of an engine log line holds (NaN when absent or not a number: None)."""
    for word in line.split():
        if word.startswith(f"{name}="):
            try:
                return float(word.split("=", 1)[1])
            except ValueError:
                return math.nan
    return math.nan


def flexible_spread(lags: list[float], jitters: list[float], window_s: float) -> dict[str, Any]:
    """How flexible occurrences spread over their window (pure; the issue's "flexible work spreads over
    its window"). ``lags[i]`` is occurrence i's enqueue instant after its scheduled time, ``jitters[i]`` its
    available_at after it (its deterministic jitter, in [0, window)).

    ``ks_from_uniform``: the Kolmogorov-Smirnov distance between the enqueue instants, as fractions of the
    window, and the uniform spread over it (0 = perfectly spread, near 1 = all at one instant, as if the
    jitter were ignored). ``share_per_tenth``: the share enqueued in each tenth of the window;
    ``after_window``: enqueued once the window had passed (dispatch behind); ``before_available_at``:
    published before their own available_at, which the relay must never do."""
    n = len(lags)
    report: dict[str, Any] = {"count": n, "window_s": window_s}
    if not n or window_s <= 0:
        return report
    fractions = sorted(max(lag, 0.0) / window_s for lag in lags)
    ks = max(max((i + 1) / n - min(x, 1.0), min(x, 1.0) - i / n) for i, x in enumerate(fractions))
    tenths = [0] * 10
    for x in fractions:
        if x < 1.0:
            tenths[int(x * 10)] += 1
    report["ks_from_uniform"] = round(ks, 4)
    report["share_per_tenth"] = [round(t / n, 4) for t in tenths]
    report["after_window"] = sum(1 for x in fractions if x >= 1.0)
    # 1 µs of slack: both instants are microsecond timestamps subtracted in float8.
    report["before_available_at"] = sum(1 for lag, jitter in zip(lags, jitters, strict=True) if lag < jitter - 1e-6)
    report["least_past_available_at_s"] = round(min(lag - jitter for lag, jitter in zip(lags, jitters, strict=True)), 6)
    # when in the window flexible work is late: per second of available_at, the median time past it
    by_second: dict[int, list[float]] = {}
    for lag, jitter in zip(lags, jitters, strict=True):
        by_second.setdefault(int(jitter), []).append(lag - jitter)
    report["past_available_at_p50_by_second"] = [
        round(statistics.median(by_second[s]), 3) if s in by_second else None for s in range(int(window_s))
    ]
    return report


def plot(
    path: Path,
    lags: dict[str, list[float]],
    rates: dict[str, list[tuple[float, int]]],
    tenant_p99: list[tuple[int, float]],
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for lane, values in lags.items():
        if values:
            ordered = sorted(values)
            axes[0].plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=lane)
    axes[0].set_xlabel("schedule_lag (s)")
    axes[0].set_ylabel("fraction of occurrences")
    axes[0].set_title("lag CDF")
    axes[0].legend()
    axes[0].grid(alpha=0.3)
    for lane, rate in rates.items():  # one line per lane: flexible work shows spread over its window
        if not rate:
            continue
        per_second: dict[int, int] = {}
        for t, n in rate:
            per_second[int(t)] = per_second.get(int(t), 0) + n
        seconds = sorted(per_second)  # closed at the end: a lane done within one second still shows
        axes[1].step([*seconds, seconds[-1] + 1], [*(per_second[k] for k in seconds), 0], where="post", label=lane)
    axes[1].set_xlabel("seconds after the top")
    axes[1].set_ylabel("dispatches / s")
    axes[1].set_title("dispatch rate")
    axes[1].legend()
    axes[1].grid(alpha=0.3)
    if tenant_p99:
        axes[2].scatter([n for n, _ in tenant_p99], [p for _, p in tenant_p99], s=8)
        axes[2].set_xscale("log")
    axes[2].set_xlabel("tenant's due occurrences")
    axes[2].set_ylabel("tenant p99 schedule_lag (s)")
    axes[2].set_title("per-tenant p99")
    axes[2].grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def readback_shortfall(
    expected: set[str], short: set[str], second_pass: set[str] | None, received: set[str] | None
) -> dict[str, Any]:
    """What each reader missed of ``expected``: the read-back's first pass (``short``), its second pass when
    there was one, and how many of the first pass's shortfall the second pass and the no-op group saw."""
    found: dict[str, Any] = {"first_pass": len(short)}
    if second_pass is not None:
        found |= {
            "second_pass": len(expected - second_pass),
            "found_by_second_pass": len(short & second_pass),
            "examples": sorted(short)[:5],
        }
    if received is not None and short:
        found["received_by_group"] = len(short & received)
    return found


def per_100ms(lags: list[float]) -> list[tuple[float, int]]:
    """Dispatches per 100 ms bin since the top, empty bins included (a gap is a stall, not a line to draw)."""
    bins: dict[int, int] = {}
    for lag in lags:
        bins[int(lag * 10)] = bins.get(int(lag * 10), 0) + 1
    return [(b / 10, bins.get(b, 0)) for b in range(0, max(bins) + 1)] if bins else []


def analyze(
    args: argparse.Namespace, report: dict[str, Any], rows: list[asyncpg.Record], seen: list[str],
    received: list[tuple[str, float]] | None, top: datetime, second_pass: set[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The figures: lag percentiles overall, per lane and per tenant size class, Kafka's missing and
    duplicate counts, the dispatch rate and its fraction of the floor; the PNG if asked for.

    An occurrence is missing when no reader saw it: not the read-back (``seen``; ``second_pass`` when the
    first fell short), not the no-op group (``received``). Each reader's shortfall is reported
    (``readback_missing``), so a short read stays visible."""
    expected = {str(r["occurrence_id"]) for r in rows}
    seen_expected = [s for s in seen if s in expected]
    enqueued = [r for r in rows if r["lag"] is not None]
    lags = {lane: [r["lag"] for r in enqueued if r["priority"] == lane] for lane in ("strict", "flexible")}
    by_tenant: dict[str, list[float]] = {}
    for r in enqueued:
        if r["priority"] == "strict" or not lags["strict"]:
            by_tenant.setdefault(r["tenant_id"], []).append(r["lag"])
    small = [lag for tenant, values in by_tenant.items() if tenant != BIG_TENANT for lag in values]
    overall = percentiles(lags["strict"] or [r["lag"] for r in enqueued])
    report["lag_s"] = {
        "strict": percentiles(lags["strict"]),
        "flexible": percentiles(lags["flexible"]),
        # A flexible occurrence is due at its available_at: its lateness is lag minus its jitter.
        "flexible_past_available_at": percentiles(
            [r["lag"] - r["jitter"] for r in enqueued if r["priority"] == "flexible"]
        ),
    }
    dispatch_rate = len(lags["strict"]) / max(lags["strict"]) if lags["strict"] and max(lags["strict"]) > 0 else None
    report["dispatch_rows_per_s"] = round(dispatch_rate) if dispatch_rate else None
    fastest = fastest_pipeline(report.get("floor", {}))
    receive: dict[str, float] = {}
    if received is not None:
        for ident, at in received:
            if ident in expected and ident not in receive:
                receive[ident] = at - top.timestamp()
        report["receive_lag_s"] = percentiles(list(receive.values()))
        report["received_distinct"] = len(receive)
    rate = per_100ms([r["lag"] for r in enqueued])
    if lags["flexible"]:
        report["flexible_spread"] = flexible_spread(
            lags["flexible"], [r["jitter"] for r in enqueued if r["priority"] == "flexible"], args.flexible_window
        )
    short = expected - set(seen_expected)
    report["readback_missing"] = readback_shortfall(expected, short, second_pass, set(receive) if received else None)
    summary = {
        "count": len(expected),
        "missing": len(short - (second_pass or set()) - set(receive)),
        "duplicates": len(seen_expected) - len(set(seen_expected)),
        **{key: round(value, 3) for key, value in overall.items()},
        "small_tenants_p99": round(percentiles(small)["p99"], 3),
        "big_tenant_p99": round(percentiles(by_tenant.get(BIG_TENANT, []))["p99"], 3),
        "limit_fraction": round(dispatch_rate / fastest, 3) if fastest and dispatch_rate else None,
        "materialize_rows_per_s": report.get("materialize_rows_per_s"),
        "dispatch_rows_per_s": report["dispatch_rows_per_s"],
        "not_enqueued": len(expected) - len(enqueued),
        "lease_losses": report.get("leases", {}).get("losses"),
        "late_renewals": report.get("leases", {}).get("late_renewals"),
        "loop_stalls": report.get("loop_stalls", {}).get("stalls"),
        "settled_during_burst": report.get("settled_during_burst"),
        "broker": args.broker,
        "relays": args.relays,
        "schedules": args.schedules,
        "flexible_fraction": args.flexible_fraction,
    }
    spread = report.get("flexible_spread")
    if spread:
        summary["flexible_p99_past_available_at"] = round(report["lag_s"]["flexible_past_available_at"]["p99"], 3)
        summary["flexible_ks_from_uniform"] = spread.get("ks_from_uniform")
        summary["flexible_before_available_at"] = spread.get("before_available_at")
    side = report.get("consumer_side")
    if side is not None:
        summary["consumer"] = args.consumer
        for key in ("handler_start_p50", "handler_start_p95", "handler_start_p99", "consumer_rows_per_s",
                    "attempt_events_per_s", "settle_s", "reaper_timeouts", "duplicates"):  # fmt: skip
            summary["consumer_duplicates" if key == "duplicates" else key] = side.get(key)
    report["summary"] = summary
    report["rate_100ms"] = rate
    if args.png and importlib.util.find_spec("matplotlib") is None:
        print("no PNG: matplotlib is missing (pip install -e '.[bench]')", flush=True)
    elif args.png:
        plot(
            Path(args.png), lags, {lane: per_100ms(values) for lane, values in lags.items()},
            [(len(v), percentiles(v)["p99"]) for v in by_tenant.values()],
            f"hour top: {args.schedules:,} due, {args.background:,} background, {args.relays} nodes, {args.broker}",
        )  # fmt: skip
    return summary
