"""Misfire recovery wired into the data plane, on real PostgreSQL and a real broker, under an injected clock.

- an engine outage: each policy yields what it promises, from the materializer to the broker, and the
  reconciler (which recomputes the slots independently) reports clean;
- a very long outage does bounded work per pass (missed slots summarised as one missed_ranges row);
- catch-up is paced by the tenant's catch_up_per_minute, one budget shared by every engine node, and runs
  in the late lane's capacity: an on-time occurrence due during a large catch-up is published on time;
- a relay outage: on-time work after recovery is published on time, late work follows the policy
  (judged again at dispatch) in both lanes.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from engine.control.quotas import TenantQuotas
from engine.control.reconciler import ReconcileOptions, Window, reconcile
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.dispatch_settler import DispatchSettler
from engine.loops.materializer import Materializer, MaterializerConfig
from engine.loops.shard_leases import ShardLeaseConfig, ShardLeases
from relay.ahead_lane import AheadLaneStore
from relay.ahead_relay import AheadRelay, AheadRelayConfig
from relay.dispatcher import Relay
from relay.outbox import OutboxStore
from schemas.clock import ManualClock
from schemas.messages import decode_occurrence
from schemas.shard_ownership import ShardOwnership
from schemas.topics import occurrence_topic
from tests.support.kafka import librdkafka_publisher, read_topic

START = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)  # the fixture clock's first instant
LEASES = ShardLeaseConfig(interval=1.0, lease_ttl=6.0, max_moves=256)
SECOND = timedelta(seconds=1)


def at(minute: int, second: int = 0, hour: int = 10) -> datetime:
    return datetime(2026, 11, 29, hour, minute, second, tzinfo=UTC)


@pytest.fixture
async def publisher(kafka_bootstrap):
    async with librdkafka_publisher(kafka_bootstrap) as publisher:
        yield publisher


class Node:
    """One engine node's data plane in a test: shard leases, the materializer, both relays, the settle pass."""

    def __init__(
        self, pool: asyncpg.Pool, clock: ManualClock, publisher: Any, rows_per_shard: int = 64, **config: Any
    ) -> None:
        self.pool, self.clock = pool, clock
        self.ownership = ShardOwnership("node-a")
        self.leases = ShardLeases(pool, self.ownership, LEASES, clock)
        self.materializer = Materializer(pool, MaterializerConfig(**config), clock, ownership=self.ownership)
        store = AheadLaneStore(pool, clock, self.ownership.node_id)
        # read_ahead 1 s with the clock on whole seconds: a row is read and released at its own instant
        relay_config = AheadRelayConfig(read_ahead=SECOND, rows_per_shard=rows_per_shard)
        self.ahead = AheadRelay(store, publisher, self.ownership, relay_config, clock)
        self.late = Relay(OutboxStore(pool, clock), publisher)
        self.settler = DispatchSettler(pool, clock=clock)

    async def materialize(self) -> None:
        await self.leases.run_once()
        while (await self.materializer.run_once()).schedules:
            pass

    async def relay(self) -> tuple[int, int]:
        """Both lanes once at the clock's instant: (ahead rows published, outbox rows published)."""
        ahead = await self.ahead.run_once()
        late = 0
        while (report := await self.late.run_once()).claimed:
            late += report.published
        return ahead.published, late

    async def settle(self) -> None:
        while (await self.settler.run_once()).entries:
            pass


async def published_instants(bootstrap: str, target: str, expected: int) -> list[datetime]:
    records = await read_topic(bootstrap, occurrence_topic(target), expected=expected, settle=1.0)
    return sorted(decode_occurrence(r.value).scheduled_for for r in records)


async def states(pool: asyncpg.Pool, schedule_id: str) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT state, count(*) FROM occurrences WHERE schedule_id = $1::uuid GROUP BY state", uuid.UUID(schedule_id)
    )
    return dict(rows)


# ---------------------------------------------------------------------------------------------- engine outage


@pytest.mark.parametrize(
    ("policy", "late_published", "missed_rows", "summarised"),
    [
        ("skip", [], 4, 6),  # 10 late slots: 4 listed MISSED, 6 summarised in one range
        ("fire_once", [at(10)], 4, 5),
        ("catch_up:3", [at(8), at(9), at(10)], 4, 3),
    ],
)
async def test_a_ten_minute_engine_outage_yields_exactly_what_each_policy_promises(
    pool, clock, publisher, target, kafka_bootstrap, acme, policy, late_published, missed_rows, summarised
):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme",
        {"kind": "cron", "expression": "* * * * *", "target": target, "misfire_policy": policy, "max_lateness": "30s"},
    )
    node = Node(pool, clock, publisher, missed_record_limit=4)
    clock.set(at(10, 45))  # the engine was down from 10:00:00: 10:01..10:10 are late, 10:11 is ahead
    await node.materialize()
    await node.relay()  # catch-ups, released at once (the tenant's bucket is full)
    clock.set(at(11))
    assert (await node.relay())[0] == 1  # 10:11 from the ahead lane, at its instant
    await node.settle()
    assert await published_instants(kafka_bootstrap, target, len(late_published) + 1) == [*late_published, at(11)]
    assert await states(pool, schedule["schedule_id"]) == {
        "MISSED": missed_rows,
        **({"ENQUEUED": len(late_published) + 1}),
    }
    ranges = await pool.fetch("SELECT first_missed, last_missed, missed_count FROM missed_ranges")
    assert [tuple(r) for r in ranges] == [(at(5), at(4 + summarised), summarised)]
    report = await reconcile(pool, Window(START, at(11, 1)), clock=clock, record=False)
    assert report.clean, report.counts
    assert report.counts["missing"] == 0 and report.counts["summarized"] == summarised


async def test_a_three_day_outage_of_an_every_second_schedule_does_bounded_work_per_pass(pool, clock, target, acme):
    control = ControlPlane(pool, clock)
    skip = await control.create_schedule(
        "acme",
        {"kind": "rate", "expression": "1s", "target": target, "misfire_policy": "skip", "max_lateness": "3660d"},
    )
    catch_up = await control.create_schedule(
        "acme",
        {"kind": "rate", "expression": "1s", "target": target, "misfire_policy": "catch_up:3", "max_lateness": "1d"},
    )
    cursor = clock.now() + SECOND
    clock.advance(timedelta(days=3))
    now = clock.now()
    materializer = Materializer(pool, MaterializerConfig(horizon=timedelta(seconds=30)), clock)
    started = time.perf_counter()
    report = await materializer.run_once()
    elapsed = time.perf_counter() - started
    # on time: at most on_time_limit (5 min) late, plus the horizon: 301 + 30 instants per schedule
    on_time = 331
    assert report.schedules == 2
    assert report.occurrences == 2 * on_time + 3 and report.catch_up == 3
    assert report.missed == 2 * 1000  # missed_record_limit rows each; the rest summarised
    late = int((now - timedelta(minutes=5) - cursor) / SECOND)  # slots from the cursor to 5 min before now
    ranges = {
        r["schedule_id"]: r["missed_count"]
        for r in await pool.fetch("SELECT schedule_id, missed_count FROM missed_ranges")
    }
    assert ranges == {uuid.UUID(skip["schedule_id"]): late - 1000, uuid.UUID(catch_up["schedule_id"]): late - 1003}
    assert elapsed < 10, f"one pass over a three-day outage took {elapsed:.2f} s"
    # the next pass has nothing to do: the cursors passed now + horizon
    assert (await materializer.run_once()).schedules == 0
    report_ = await reconcile(
        pool,
        Window(now - timedelta(hours=1), now),
        clock=clock,
        record=False,
        options=ReconcileOptions(on_time_limit=timedelta(minutes=5)),
    )
    assert report_.clean and report_.counts["missing"] == 0


# ---------------------------------------------------------------------------------------------- catch-up pacing


async def test_catch_up_is_paced_by_the_tenants_budget_shared_by_every_node(pool, clock, publisher, target):
    await create_tenant(pool, "slow", TenantQuotas(catch_up_per_minute=6))  # a burst of 6, then one per 10 s
    control = ControlPlane(pool, clock)
    for _ in range(5):
        await control.create_schedule(
            "slow",
            {"kind": "cron", "expression": "* * * * *", "target": target, "misfire_policy": "catch_up:4",
             "max_lateness": "30s"},
        )  # fmt: skip
    clock.set(at(10, 30))  # a ten-minute outage: 4 catch-ups per schedule, 20 in all
    # two engine nodes, each materializing half of the shards: one budget between them
    nodes = [
        Materializer(pool, MaterializerConfig(horizon=timedelta(0), shards=tuple(range(half, 256, 2))), clock)
        for half in (0, 1)
    ]
    reports = [await node.run_once() for node in nodes]
    assert sum(r.catch_up for r in reports) == 20 and sum(r.throttled for r in reports) == 14
    releases = sorted(
        await pool.fetch(
            "SELECT o.available_at FROM outbox o JOIN occurrences c USING (occurrence_id)"
            " WHERE c.scheduled_for < $1 ORDER BY 1",
            at(10),
        ),
        key=lambda r: r[0],
    )
    expected = [at(10, 30)] * 6 + [at(10, 30) + timedelta(seconds=10 * i) for i in range(1, 15)]
    assert [r[0] for r in releases] == expected
    bucket = await pool.fetchrow("SELECT tokens, updated_at FROM tenant_catch_up_buckets WHERE tenant_id = 'slow'")
    assert (bucket["tokens"], bucket["updated_at"]) == (0, expected[-1])
    # the late relay publishes each one at its release, never before: never more than the budget by any instant
    relay = Relay(OutboxStore(pool, clock), publisher)
    for step in range(0, 150, 5):
        clock.set(at(10, 30) + timedelta(seconds=step))
        while (await relay.run_once()).claimed:
            pass
    sent = await pool.fetch(
        "SELECT o.available_at, o.sent_at FROM outbox o JOIN occurrences c USING (occurrence_id)"
        " WHERE c.scheduled_for < $1",
        at(10),
    )
    assert len(sent) == 20 and all(r["sent_at"] == r["available_at"] for r in sent)


async def test_an_on_time_occurrence_due_during_a_large_catch_up_is_published_on_time(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    # max_running above the 1,100 occurrences: this is about catch-up pacing, not the tenant gate (no consumer
    # finishes anything here, so with the default 100 the gate would hold all but 100 of them).
    quotas = TenantQuotas(catch_up_per_minute=100, max_active_schedules=1000, max_running=2000)
    await create_tenant(pool, "big", quotas)
    control = ControlPlane(pool, clock)
    for _ in range(100):
        await control.create_schedule(
            "big",
            {"kind": "cron", "expression": "* * * * *", "target": f"{target}-big", "misfire_policy": "catch_up:10",
             "max_lateness": "30s"},
        )  # fmt: skip
    node = Node(pool, clock, publisher)
    clock.set(at(10, 40))
    due = at(10, 50)
    on_time = await control.create_schedule("acme", {"kind": "once", "expression": due.isoformat(), "target": target})
    await node.materialize()  # 1,000 catch-ups (100 now, the rest over nine minutes) and the on-time one, ahead
    assert (
        await pool.fetchval("SELECT count(*) FROM outbox WHERE occurrence_id IS NOT NULL AND late_after IS NULL")
        == 1000
    )
    await node.relay()  # the catch-ups released so far, through the late lane
    clock.set(due)
    ahead, late = await node.relay()
    assert ahead == 1  # the on-time occurrence, at its instant, whatever the catch-up backlog
    await node.settle()
    row = await pool.fetchrow(
        "SELECT state, enqueued_at FROM occurrences WHERE schedule_id = $1::uuid", uuid.UUID(on_time["schedule_id"])
    )
    assert (row["state"], row["enqueued_at"]) == ("ENQUEUED", due)
    waiting = await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL AND occurrence_id IS NOT NULL")
    assert 800 <= waiting <= 890  # the catch-up still paced behind it (100 + ~17 per 10 s)
    assert len(await published_instants(kafka_bootstrap, target, 1)) == 1


# ---------------------------------------------------------------------------------------------- relay outage


# Six cases of the relay's policy judgement, not of the broker's (which only carries the result): one broker
# (the suite's time budget).
@pytest.mark.on_broker("tansu")
@pytest.mark.parametrize("lane", ["ahead", "late"])
@pytest.mark.parametrize(
    ("policy", "late_every_10s", "late_every_minute"),
    [
        ("skip", [], []),
        ("fire_once", [], [at(5)]),  # the every-10-s schedule has on-time work at recovery: none late
        ("catch_up:2", [at(4, 20), at(4, 30)], [at(4), at(5)]),
    ],
)
async def test_a_relay_outage_publishes_on_time_work_on_time_and_applies_the_policy_to_late_work(
    pool, clock, publisher, target, kafka_bootstrap, acme, lane, policy, late_every_10s, late_every_minute
):
    control = ControlPlane(pool, clock)
    every_10s = await control.create_schedule(
        "acme",
        {"kind": "rate", "expression": "10s", "target": target, "misfire_policy": policy, "max_lateness": "30s"},
    )
    every_minute = await control.create_schedule(
        "acme",
        {"kind": "rate", "expression": "1m", "target": target, "misfire_policy": policy, "max_lateness": "0s"},
    )
    node = Node(pool, clock, publisher)
    if lane == "late":  # a materializer without shard leases writes every delivery to the outbox
        node.materializer = Materializer(pool, MaterializerConfig(), clock)
    # the engine runs throughout; the relays are down from 10:00:00 to 10:05:03
    while clock.now() < at(5, 3):
        clock.advance(min(timedelta(seconds=5), at(5, 3) - clock.now()))
        await node.materialize()
    ahead, late = await node.relay()  # recovery at 10:05:03: 10:04:40, 10:04:50, 10:05:00 are on time
    # then the relays keep up: every instant until 10:06 is published at its own instant
    for second in range(10, 61, 10):
        clock.set(at(5) + timedelta(seconds=second))
        await node.materialize()
        await node.relay()
    await node.settle()
    on_time_10s = [at(4, 40), at(4, 50), at(5)] + [at(5) + timedelta(seconds=s) for s in range(10, 61, 10)]
    expected = sorted([*late_every_10s, *on_time_10s, *late_every_minute, at(6)])
    assert await published_instants(kafka_bootstrap, target, len(expected)) == expected
    late_10s = 27 - len(late_every_10s)  # 10:00:10 .. 10:04:30 are late at 10:05:03
    assert (await states(pool, every_10s["schedule_id"]))["MISSED"] == late_10s
    assert (await states(pool, every_minute["schedule_id"])).get("MISSED", 0) == 5 - len(late_every_minute)
    # on time means on time: each on-time occurrence was acknowledged at its own instant (or at recovery)
    lags = await pool.fetch(
        "SELECT scheduled_for, enqueued_at FROM occurrences WHERE state = 'ENQUEUED' AND scheduled_for > $1",
        at(5, 3),
    )
    assert lags and all(r["enqueued_at"] == r["scheduled_for"] for r in lags)
    report = await reconcile(pool, Window(START, at(6, 1)), clock=clock, record=False)
    assert report.clean and report.counts["missing"] == 0


async def test_catch_up_k_holds_when_a_schedules_late_rows_span_many_pages(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "acme",
        {"kind": "rate", "expression": "10s", "target": target, "misfire_policy": "catch_up:2", "max_lateness": "30s"},
    )
    node = Node(pool, clock, publisher, rows_per_shard=2)  # 36 rows in one shard: 18 pages, 3 in flight
    while clock.now() < at(5, 3):  # the relay is down while the engine keeps materializing
        clock.advance(min(timedelta(seconds=5), at(5, 3) - clock.now()))
        await node.materialize()
    report = await node.ahead.run_once()
    assert report.missed == 25 and report.published == 5  # 2 late ones and 10:04:40, 10:04:50, 10:05:00
    await node.settle()
    expected = [at(4, 20), at(4, 30), at(4, 40), at(4, 50), at(5)]
    assert await published_instants(kafka_bootstrap, target, len(expected)) == expected
    assert (await states(pool, schedule["schedule_id"]))["MISSED"] == 25


async def test_a_tenant_without_catch_up_budget_gets_its_late_slots_recorded_missed(pool, clock, target):
    await create_tenant(pool, "frozen", TenantQuotas(catch_up_per_minute=0))
    control = ControlPlane(pool, clock)
    schedule = await control.create_schedule(
        "frozen",
        {"kind": "cron", "expression": "* * * * *", "target": target, "misfire_policy": "catch_up:3",
         "max_lateness": "30s"},
    )  # fmt: skip
    clock.set(at(10, 45))
    report = await Materializer(pool, MaterializerConfig(horizon=timedelta(0)), clock).run_once()
    assert (report.catch_up, report.catch_up_refused, report.missed) == (0, 3, 10)
    assert await states(pool, schedule["schedule_id"]) == {"MISSED": 10}
    assert await pool.fetchval("SELECT runs FROM schedules") == 0
    report_ = await reconcile(pool, Window(START, at(10, 46)), clock=clock, record=False)
    assert report_.clean and report_.counts["missing"] == 0
