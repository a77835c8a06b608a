"""`chronoq status`: what the engine is doing right now, in one read-only pass.

Engine nodes and shard ownership, lease
expiries, materialization lag and the due backlog by age, the outbox backlog,
relay rates, attempts in flight and the dead-letter list, consumer lag per
group from the broker (the attempt processor's own lag on
``chronoq.attempts`` among them), and the last reconcile result. Every query
is bounded (indexes, or a capped scan of the newest outbox rows), so status
is safe to poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from engine.control.consumer_lag import read_consumer_lag
from schemas.clock import Clock, DatabaseClock
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.messages import format_instant
from schemas.queries import QUERIES
from schemas.topics import ATTEMPTS_TOPIC

RECENT_OUTBOX_ROWS = 200_000


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    """later - earlier in seconds."""
    if later is None or earlier is None:
        return None
    return round((later - earlier).total_seconds(), 3)


def _instant(value: datetime | None) -> str | None:
    return format_instant(value) if value is not None else None


async def engine_status(
    pool: asyncpg.Pool,
    kafka_bootstrap: str | None,
    *,
    clock: Clock | None = None,
    horizon: timedelta = timedelta(seconds=30),
    kafka_timeout: float = 5.0,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[str, Any]:
    """The status as one JSON-ready mapping (see the module docstring for its sections)."""
    clock = clock or DatabaseClock()
    async with pool.acquire() as conn:
        now: datetime = await conn.fetchval(*QUERIES.current_instant(now=clock.now()))
        status: dict[str, Any] = {"as_of": format_instant(now)}
        status["nodes"] = await _nodes(conn, now)
        status["shards"] = await _shards(conn, now)
        status["schedules"] = {r["state"]: r["schedules"] for r in await conn.fetch(*QUERIES.schedule_counts())}
        due = await conn.fetchrow(*QUERIES.materialization_backlog(now=now, horizon_s=horizon.total_seconds()))
        status["materialization"] = {
            "lag_s": max(_seconds(now, due["oldest_cursor"]) or 0.0, 0.0) if due["oldest_cursor"] else 0.0,
            "oldest_cursor": _instant(due["oldest_cursor"]),
            "due_by_age": {
                "over_1h": due["over_1h"],
                "5m_to_1h": due["from_5m_to_1h"],
                "1m_to_5m": due["from_1m_to_5m"],
                "under_1m": due["under_1m"],
            },
            "due_within_horizon": due["within_horizon"],
        }
        outbox = await conn.fetchrow(*QUERIES.outbox_backlog_buckets(now=now))
        status["outbox"] = {
            "backlog": outbox["due"],
            "due_over_5s": outbox["due_over_5s"],
            "due_over_1m": outbox["due_over_1m"],
            "claimed": outbox["claimed"],
            "held_by_overlap_gate": outbox["held_by_overlap_gate"],
            "oldest_due_age_s": _seconds(now, outbox["oldest_due"]) if outbox["oldest_due"] else 0.0,
        }
        rates = await conn.fetchrow(*QUERIES.relay_rates(now=now, recent=RECENT_OUTBOX_ROWS))
        status["relay"] = {
            "sent_10s": rates["sent_10s"],
            "sent_60s": rates["sent_60s"],
            "sent_5m": rates["sent_5m"],
            "per_second_60s": round(rates["sent_60s"] / 60, 1),
            "last_sent": _instant(rates["last_sent"]),
        }
        flight = await conn.fetchrow(*QUERIES.in_flight(now=now))
        status["attempts"] = {
            "running": flight["running"],
            "running_past_lease": flight["running_past_lease"],
            "oldest_lease_expires_in_s": _seconds(flight["oldest_lease_expiry"], now),
            "enqueued": flight["enqueued"],
            "oldest_enqueued_age_s": _seconds(now, flight["oldest_enqueued"]) if flight["oldest_enqueued"] else 0.0,
            "stuck_watched": flight["stuck_watched"],
            "stuck_flagged": flight["stuck_flagged"],
        }
        status["dlq"] = {"size": flight["dead"]}
        run = await conn.fetchrow(*QUERIES.last_reconcile())
        status["last_reconcile"] = (
            None
            if run is None
            else {
                "run_id": run["run_id"],
                "finished_at": _instant(run["finished_at"]),
                "window": {"from": _instant(run["window_from"]), "to": _instant(run["window_to"])},
                "tenant_id": run["tenant_id"],
                "clean": run["clean"],
                "duration_s": round(run["duration_s"], 3),
                "age_s": _seconds(now, run["finished_at"]),
                "counts": {
                    k: run["counts"].get(k)
                    for k in (
                        "expected",
                        "missing",
                        "unexpected",
                        "duplicate_slots",
                        "policy_violations",
                        "pending",
                        "stuck",
                    )
                    if k in run["counts"]
                },
            }
        )
    status["consumers"] = await _consumers(kafka_bootstrap, kafka_timeout, security)
    return status


async def _nodes(conn: asyncpg.Connection, now: datetime) -> dict[str, Any]:
    nodes = [
        {
            "node": row["node_id"],
            "heartbeat_age_s": round(row["heartbeat_age_s"], 3),
            "expires_in_s": round(row["expires_in_s"], 3),
            "live": row["expires_in_s"] > 0,
        }
        for row in await conn.fetch(*QUERIES.engine_node_ages(now=now))
    ]
    return {"nodes": nodes}


async def _shards(conn: asyncpg.Connection, now: datetime) -> dict[str, Any]:
    rows = await conn.fetch(*QUERIES.shard_lease_owners(now=now))
    owned = [row for row in rows if row["owner"] is not None]
    return {
        "leases": sum(row["shards"] for row in rows),
        "unowned": sum(row["shards"] for row in rows if row["owner"] is None),
        "expired": sum(row["expired"] for row in owned),
        "owners": [
            {
                "owner": row["owner"],
                "shards": row["shards"],
                "soonest_expiry_in_s": None
                if row["soonest_expiry_in_s"] is None
                else round(row["soonest_expiry_in_s"], 3),
                "max_epoch": row["max_epoch"],
            }
            for row in owned
        ],
    }


async def _consumers(kafka_bootstrap: str | None, timeout: float, security: KafkaSecurity) -> dict[str, Any]:
    if not kafka_bootstrap:
        return {"note": "no broker configured"}
    try:
        lags = await read_consumer_lag(kafka_bootstrap, timeout=timeout, security=security)
    except Exception as err:  # noqa: BLE001 - whatever the broker does, status shows it and carries on
        return {"error": f"could not read consumer lag from {kafka_bootstrap}: {err!r}"}
    attempts = [lag for lag in lags if lag.topic == ATTEMPTS_TOPIC]
    return {
        "groups": [lag.to_json() for lag in lags],
        "attempt_processor_lag": sum(lag.lag for lag in attempts) if attempts else None,
    }


def status_lines(status: Mapping[str, Any]) -> list[str]:
    """The status as text for a terminal."""
    out = [f"chronoq status as of {status['as_of']}"]
    if not status["nodes"]["nodes"]:
        out.append("  nodes: none registered (no engine node has run on this database)")
    for node in status["nodes"]["nodes"]:
        out.append(
            f"  node {node['node']}: heartbeat {node['heartbeat_age_s']} s ago, expires in"
            f" {node['expires_in_s']} s{'' if node['live'] else ' (EXPIRED)'}"
        )
    shards = status["shards"]
    out.append(f"  shards: {shards['leases']} leases, {shards['unowned']} unowned, {shards['expired']} expired")
    for owner in shards["owners"]:
        out.append(
            f"    {owner['owner']}: {owner['shards']} shards, soonest expiry in"
            f" {owner['soonest_expiry_in_s']} s, epoch <= {owner['max_epoch']}"
        )
    out.append("  schedules: " + (", ".join(f"{k} {v}" for k, v in sorted(status["schedules"].items())) or "none"))
    m = status["materialization"]
    ages = m["due_by_age"]
    out.append(
        f"  materialization lag {m['lag_s']} s; due: over 1h {ages['over_1h']}, 5m-1h {ages['5m_to_1h']},"
        f" 1m-5m {ages['1m_to_5m']}, under 1m {ages['under_1m']}; within horizon {m['due_within_horizon']}"
    )
    o = status["outbox"]
    out.append(
        f"  outbox backlog {o['backlog']} (over 5 s {o['due_over_5s']}, over 1 min {o['due_over_1m']},"
        f" oldest {o['oldest_due_age_s']} s); claimed {o['claimed']}, held by the overlap gate"
        f" {o['held_by_overlap_gate']}"
    )
    r = status["relay"]
    out.append(
        f"  relay: {r['sent_10s']} sent in 10 s, {r['sent_60s']} in 60 s ({r['per_second_60s']}/s),"
        f" {r['sent_5m']} in 5 min; last {r['last_sent']}"
    )
    a = status["attempts"]
    out.append(
        f"  attempts: {a['running']} running ({a['running_past_lease']} past their lease),"
        f" {a['enqueued']} enqueued (oldest {a['oldest_enqueued_age_s']} s), stuck watched"
        f" {a['stuck_watched']}, flagged {a['stuck_flagged']}"
    )
    out.append(f"  dead letters: {status['dlq']['size']}")
    consumers = status["consumers"]
    if "groups" in consumers:
        out.append(f"  consumer lag (attempt processor: {consumers['attempt_processor_lag']}):")
        for group in consumers["groups"]:
            out.append(f"    {group['group']} {group['topic']}: {group['lag']} over {group['partitions']} partitions")
    else:
        out.append(f"  consumers: {consumers.get('note') or consumers.get('error')}")
    run = status["last_reconcile"]
    if run is None:
        out.append("  last reconcile: never run (chronoq reconcile --last 1h)")
    else:
        out.append(
            f"  last reconcile #{run['run_id']} {'CLEAN' if run['clean'] else 'NOT CLEAN'}"
            f" {run['window']['from']}..{run['window']['to']} ({run['age_s']} s ago): {run['counts']}"
        )
    return out
