"""The sharded data plane on the real stack: leases, the ahead lane, seals, fencing, poison rows, settling."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from engine.control.schedules import ControlPlane
from engine.loops.dispatch_settler import DispatchSettler
from engine.loops.materializer import Materializer, MaterializerConfig, MaterializerHooks
from engine.loops.service import DataPlaneConfig, open_data_plane
from engine.loops.shard_leases import ShardLeaseConfig, ShardLeases
from engine.rules.timing import jitter_offset
from relay.ahead_lane import AheadLaneStore
from relay.ahead_relay import AheadRelay, AheadRelayConfig, AheadRelayHooks
from relay.dispatcher import Relay
from relay.librdkafka_publisher import LibrdkafkaPublisher
from relay.outbox import OutboxStore
from schemas.clock import DatabaseClock, ManualClock
from schemas.connections import create_pool
from schemas.dispatch_lanes import bucket_of
from schemas.messages import decode_occurrence
from schemas.shard_ownership import ShardOwnership
from schemas.topics import occurrence_topic, schedule_key
from tests.support.kafka import librdkafka_publisher, read_topic
from tests.support.telemetry import Telemetry
from tests.support.waiting import wait_for

AT = datetime(2026, 11, 29, 10, 0, 10, tzinfo=UTC)  # the fixture clock starts at 10:00:00
LEASES = ShardLeaseConfig(interval=1.0, lease_ttl=6.0, max_moves=256)


class CountingClock(ManualClock):
    """A manual clock that counts how often it was read (to know a waiting loop has looked at it)."""

    reads = 0

    def now(self) -> datetime:
        self.reads += 1
        return super().now()


class SpyPublisher:
    """The real librdkafka publisher, recording the clock's instant at every hand-over to it."""

    def __init__(self, inner: LibrdkafkaPublisher, clock: ManualClock) -> None:
        self.inner, self.clock = inner, clock
        self.sends: list[tuple[datetime, list[bytes]]] = []
        self.answers: list[asyncio.Future] = []  # per hand-over, resolved once the broker answered it

    async def ensure_topics(self, topics):
        await self.inner.ensure_topics(topics)

    async def send(self, items):
        self.sends.append((self.clock.now(), [item[1] for item in items]))
        answer = await self.inner.send(items)
        self.answers.append(answer)
        return answer


@pytest.fixture
def clock() -> CountingClock:
    return CountingClock(datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC))


@pytest.fixture
async def publisher(kafka_bootstrap):
    async with librdkafka_publisher(kafka_bootstrap) as publisher:
        yield publisher


async def owning(pool: asyncpg.Pool, clock: ManualClock, node: str = "node-a") -> tuple[ShardLeases, ShardOwnership]:
    ownership = ShardOwnership(node)
    leases = ShardLeases(pool, ownership, LEASES, clock)
    await leases.run_once()
    return leases, ownership


def relay_of(pool, publisher, ownership, clock, **config) -> AheadRelay:
    config.setdefault("read_ahead", timedelta(seconds=2))
    hooks = config.pop("hooks", None)
    store = AheadLaneStore(pool, clock, ownership.node_id)
    return AheadRelay(store, publisher, ownership, AheadRelayConfig(**config), clock, hooks=hooks)


async def create_once(pool, clock, target, at=AT, **fields):
    control = ControlPlane(pool, clock)
    return await control.create_schedule(
        "acme", {"kind": "once", "target": target, "expression": at.isoformat(), **fields}
    )


async def test_two_nodes_split_the_shards_and_a_stopped_node_hands_them_over(pool, clock):
    a, owner_a = await owning(pool, clock, "node-a")
    assert len(owner_a) == 256
    b, owner_b = ShardLeases(pool, ShardOwnership("node-b"), LEASES, clock), None
    owner_b = b.ownership
    for _ in range(3):  # b joins: a gives up half, b takes it
        await b.run_once()
        await a.run_once()
    await b.run_once()
    assert (len(owner_a), len(owner_b)) == (128, 128)
    assert not set(owner_a.snapshot()) & set(owner_b.snapshot())
    await a.release_all()
    await b.run_once()
    assert len(owner_b) == 256
    assert await pool.fetchval("SELECT count(*) FROM engine_nodes WHERE node_id = 'node-a'") == 0


async def test_a_node_that_missed_its_renewals_is_fenced_everywhere(pool, clock, publisher, target, acme):
    a, owner_a = await owning(pool, clock, "node-a")
    stale = dict(owner_a.snapshot())
    clock.advance(timedelta(seconds=7))  # a stalls past its lease; b takes every shard, bumping the epochs
    b, owner_b = await owning(pool, clock, "node-b")
    assert len(owner_b) == 256
    assert all(owner_b.epoch(s) == stale[s] + 1 for s in stale)
    # a wakes up with its old epochs: its materializer writes nothing, its seals and cursor moves do nothing.
    await create_once(pool, clock, target, at=clock.now() + timedelta(seconds=10))
    stale_owner = ShardOwnership("node-a")
    stale_owner.replace(stale)
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=stale_owner).run_once()
    assert (report.schedules, report.occurrences) == (0, 0)
    store = AheadLaneStore(pool, clock, "node-a")
    assert (await store.seal("strict", stale, clock.now() + timedelta(minutes=5))).sealed_until == {}
    # its lease loop learns it lost them at the first renewal
    round_ = await a.run_once()
    assert len(round_.lost) == 256


async def test_ahead_rows_are_read_early_and_released_exactly_at_available_at(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    schedule = await create_once(pool, clock, target)
    _, ownership = await owning(pool, clock)
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (1, 0)
    spy = SpyPublisher(publisher, clock)
    read = asyncio.Event()

    async def page_read() -> None:
        read.set()

    relay = relay_of(pool, spy, ownership, clock, hooks=AheadRelayHooks(after_read=page_read))
    clock.set(AT - timedelta(seconds=1.5))  # the 10:00:10 bucket is not sealed yet: nothing to read
    assert (await relay.run_once()).read == 0
    clock.set(AT - timedelta(seconds=0.8))  # sealed up to 10:00:11: read ahead, held until due
    task = asyncio.create_task(relay.run_once())
    await asyncio.wait_for(read.wait(), 10)
    reads = clock.reads
    await wait_for(lambda: clock.reads > reads + 20)  # the release loop looked at the clock many times
    assert spy.sends == [] and not task.done()
    clock.set(AT)
    published = await asyncio.wait_for(task, 20)
    assert published.published == 1
    assert [at for at, _ in spy.sends] == [AT]
    (record,) = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=1)
    occurrence = decode_occurrence(record.value)
    assert occurrence.schedule_id == uuid.UUID(schedule["schedule_id"])
    # The API shows it ENQUEUED at the acknowledgement before the settle pass wrote anything down ...
    control = ControlPlane(pool, clock)
    view = await control.get_occurrence("acme", occurrence.occurrence_id)
    assert (view["state"], view["enqueued_at"]) == ("ENQUEUED", "2026-11-29T10:00:10Z")
    assert await pool.fetchval("SELECT state FROM occurrences") == "SCHEDULED"
    # The page was logged at the relay's clock (the settle pass defers by it while a burst goes on).
    assert await pool.fetchval("SELECT logged_at FROM dispatch_log") == AT
    # ... and the settle pass records it and removes the queue row.
    settled = await DispatchSettler(pool, clock=clock).run_once()
    assert (settled.entries, settled.rows, settled.occurrences) == (1, 1, 1)
    row = await pool.fetchrow("SELECT state, enqueued_at FROM occurrences")
    assert (row["state"], row["enqueued_at"]) == ("ENQUEUED", AT)
    assert await pool.fetchval("SELECT count(*) FROM dispatch_queue") == 0


async def _in_page_order(pool, clock, target) -> tuple[dict, dict]:
    """A schedule due at AT + 1 s whose shard sorts before that of one due at AT: in a page (ordered by
    shard, then key) the later-due row comes first and the earlier-due one last."""
    control = ControlPlane(pool, clock)
    shard_of = "SELECT shard FROM schedules WHERE schedule_id = $1"
    early = await create_once(pool, clock, target, at=AT)
    while await pool.fetchval(shard_of, uuid.UUID(early["schedule_id"])) == 0:
        await control.cancel_schedule("acme", early["schedule_id"])
        early = await create_once(pool, clock, target, at=AT)
    early_shard = await pool.fetchval(shard_of, uuid.UUID(early["schedule_id"]))
    while True:
        later = await create_once(pool, clock, target, at=AT + timedelta(seconds=1))
        if await pool.fetchval(shard_of, uuid.UUID(later["schedule_id"])) < early_shard:
            return early, later
        await control.cancel_schedule("acme", later["schedule_id"])


async def test_a_page_never_releases_a_row_before_its_own_available_at(pool, clock, publisher, target, acme):
    """Rows of one page are released one by one at their own available_at, whatever their order in the page
    (by shard, then key): a page whose last row is due must not release the earlier rows not yet due."""
    early, later = await _in_page_order(pool, clock, target)
    _, ownership = await owning(pool, clock)
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (2, 0)
    spy = SpyPublisher(publisher, clock)
    relay = relay_of(pool, spy, ownership, clock)
    clock.set(AT)  # sealed up to AT + 2 s: one page holds both rows, the one due at AT last
    task = asyncio.create_task(relay.run_once())
    await wait_for(lambda: len(spy.sends) >= 1, 10)
    reads = clock.reads
    # the release loop looks at the clock many times for the row still waiting (or, wrongly, is done)
    await wait_for(lambda: clock.reads > reads + 20 or task.done())
    assert [len(keys) for _, keys in spy.sends] == [1], "a row was handed to the broker before its available_at"
    await wait_for(lambda: spy.answers and spy.answers[0].done())  # acknowledged while the clock reads AT
    clock.set(AT + timedelta(seconds=1))
    assert (await asyncio.wait_for(task, 20)).published == 2
    assert spy.sends == [
        (AT, [schedule_key(early["schedule_id"])]),
        (AT + timedelta(seconds=1), [schedule_key(later["schedule_id"])]),
    ]
    # Each second of the page is logged with its own acknowledgement instant: enqueued_at is the row's, not
    # the page's last (which would put the first row's a second late).
    await DispatchSettler(pool, clock=clock).run_once()
    enqueued = dict(await pool.fetch("SELECT schedule_id::text, enqueued_at FROM occurrences"))
    assert enqueued == {early["schedule_id"]: AT, later["schedule_id"]: AT + timedelta(seconds=1)}


async def waiting_on_lock(pool: asyncpg.Pool, fragment: str) -> bool:
    return await pool.fetchval(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        f"%{fragment}%",
    )


async def test_an_insert_held_open_across_a_seal_is_published_not_lost(engine_db, pool, clock, publisher, target, acme):
    """Out-of-order commit: the materializer's transaction has read the seal and staged its row; the relay
    asks to seal past that row's instant before the transaction commits. The seal waits; the row is read."""
    schedule = await create_once(pool, clock, target)
    _, ownership = await owning(pool, clock)
    blocker = await asyncpg.connect(engine_db)
    await blocker.execute("BEGIN")
    materializing = relaying = None
    try:
        # Something else holds the schedule row (a control-plane change in flight): the materializer's advance
        # waits inside its transaction, which already holds the shard's seal FOR SHARE.
        await blocker.execute(
            "SELECT 1 FROM schedules WHERE schedule_id = $1::uuid FOR UPDATE", uuid.UUID(schedule["schedule_id"])
        )
        materializer = Materializer(pool, MaterializerConfig(), clock, ownership=ownership)
        materializing = asyncio.create_task(materializer.run_once())
        await wait_for(lambda: waiting_on_lock(pool, "One statement per batch. First advances"))
        clock.set(AT - timedelta(seconds=0.8))
        relay = relay_of(pool, publisher, ownership, clock)
        relaying = asyncio.create_task(relay.run_once())
        await wait_for(lambda: waiting_on_lock(pool, "UPDATE dispatch_seals"))
        await blocker.execute("COMMIT")
        assert (await asyncio.wait_for(materializing, 10)).ahead == 1
        clock.set(AT)
        assert (await asyncio.wait_for(relaying, 20)).published == 1
    finally:
        await blocker.close()
        for task in (materializing, relaying):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (materializing, relaying) if t is not None), return_exceptions=True)


async def test_a_delivery_due_before_the_seal_goes_to_the_late_lane_and_is_published(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    clock.set(AT - timedelta(seconds=0.5))
    _, ownership = await owning(pool, clock)  # leases are judged on the clock: take them at its instant
    await relay_of(pool, publisher, ownership, clock).run_once()  # sealed up to 10:00:11 (nothing there yet)
    await create_once(pool, clock, target)  # created after the relay sealed past its instant
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (0, 1)
    clock.set(AT)
    late = Relay(OutboxStore(pool, clock), publisher)
    # the occurrence, and the messages the schedule's creation queued (its state, its target binding)
    assert (await late.run_once()).published == await pool.fetchval("SELECT count(*) FROM outbox")
    assert await pool.fetchval("SELECT sent_at FROM outbox WHERE occurrence_id IS NOT NULL") == AT
    assert len(await read_topic(kafka_bootstrap, occurrence_topic(target), expected=1)) == 1


async def test_a_poison_row_is_quarantined_after_bounded_tries_without_blocking_its_shard(
    pool, clock, kafka_bootstrap, target, acme
):
    # The publisher's default acknowledgement timeout (the shared helper's is 10 s).
    async with librdkafka_publisher(kafka_bootstrap, max_message_bytes=2000, ack_timeout=30.0) as small:
        poison = await create_once(pool, clock, target, payload={"blob": "x" * 3000})
        fine = await create_once(pool, clock, target, at=AT + timedelta(seconds=1))
        await pool.execute("UPDATE schedules SET shard = 7")  # one shard: the fine row is behind the poison
        _, ownership = await owning(pool, clock)
        await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
        clock.set(AT + timedelta(seconds=1))
        relay = relay_of(pool, small, ownership, clock, poison_tries=3)
        reports = [await relay.run_once() for _ in range(3)]
        assert [r.failed for r in reports] == [1, 1, 0] and reports[-1].quarantined == 1
        # The row behind the poison went out with every try (at least once: until the cursor passes the
        # poison it cannot pass what follows), and never again once the poison was set aside.
        assert sum(r.published for r in reports) == 3
        assert (await relay.run_once()).read == 0
        row = await pool.fetchrow("SELECT * FROM dispatch_quarantine")
        assert row["tries"] == 3 and "MSG_SIZE_TOO_LARGE" in row["error"] and row["topic"] == occurrence_topic(target)
        published = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=3)
        assert {str(decode_occurrence(r.value).schedule_id) for r in published} == {fine["schedule_id"]}
        assert poison["schedule_id"] != fine["schedule_id"]


async def test_weighted_round_robin_serves_small_tenants_before_the_rest_of_a_big_burst(pool, clock, target):
    from engine.control.tenants import create_tenant

    await create_tenant(pool, "big")
    await create_tenant(pool, "small")
    control = ControlPlane(pool, clock)
    for _ in range(30):
        await control.create_schedule("big", {"kind": "once", "target": target, "expression": AT.isoformat()})
    for _ in range(3):  # a target belongs to one tenant: the small one has its own, in the same shard
        await control.create_schedule(
            "small", {"kind": "once", "target": f"{target}.small", "expression": AT.isoformat()}
        )
    await pool.execute("UPDATE schedules SET shard = 3")
    _, ownership = await owning(pool, clock)
    # A shard's share of a batch of 5,120 is 20 (of 256 shards): the 33 rows take two passes, in one order.
    materializer = Materializer(pool, MaterializerConfig(batch_size=5120), clock, ownership=ownership)
    passes = 0
    while (await materializer.run_once()).schedules:
        passes += 1
    assert passes == 2
    order = await pool.fetch("SELECT tenant_id FROM dispatch_queue ORDER BY shard, bucket, wrr_round, occurrence_id")
    tenants = [r["tenant_id"] for r in order]
    assert len(tenants) == 33
    assert max(i for i, t in enumerate(tenants) if t == "small") < 6  # all three in the first three rounds


async def test_the_next_second_is_read_while_this_one_is_still_being_released(pool, clock, publisher, target, acme):
    """Steady traffic: a row of the next second is read ahead as soon as its bucket is sealed, while the
    rows of the page before it still wait for their available_at — not once that page is drained (then
    every page of steady work was read just as its first row fell due, and late by the read)."""
    await create_once(pool, clock, target, at=AT + timedelta(seconds=0.9))
    await create_once(pool, clock, target, at=AT + timedelta(seconds=1.5))
    _, ownership = await owning(pool, clock)
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (2, 0)
    spy = SpyPublisher(publisher, clock)
    reads: list[datetime] = []

    async def page_read() -> None:
        reads.append(clock.now())

    relay = relay_of(pool, spy, ownership, clock, hooks=AheadRelayHooks(after_read=page_read))
    clock.set(AT - timedelta(seconds=0.9))  # sealed up to AT + 1 s: the AT bucket is read, the next is not
    task = asyncio.create_task(relay.run_once())
    await wait_for(lambda: len(reads) == 1, 10)
    looked = clock.reads
    await wait_for(lambda: clock.reads > looked + 20)  # the page is handed over: its release loop is waiting
    clock.set(AT + timedelta(seconds=0.1))  # sealed up to AT + 2 s: the next bucket is readable
    await wait_for(lambda: len(reads) == 2 or task.done(), 10)
    assert reads == [AT - timedelta(seconds=0.9), AT + timedelta(seconds=0.1)], "the next second was not read ahead"
    assert spy.sends == [] and not task.done()
    clock.set(AT + timedelta(seconds=0.9))
    await wait_for(lambda: len(spy.sends) == 1, 10)
    clock.set(AT + timedelta(seconds=1.5))
    assert (await asyncio.wait_for(task, 20)).published == 2
    assert [at for at, _ in spy.sends] == [AT + timedelta(seconds=0.9), AT + timedelta(seconds=1.5)]


class SpyStore(AheadLaneStore):
    """The real store, recording the clock's instant and the row count of every page read."""

    def __init__(self, pool: asyncpg.Pool, clock: ManualClock, node_id: str) -> None:
        super().__init__(pool, clock, node_id)
        self.manual = clock
        self.reads: list[tuple[datetime, int]] = []
        self.advances: list[tuple[datetime, str]] = []  # (clock, lane) of every cursor move

    async def read_page(self, lane, positions, seals, rows_per_shard):
        rows = await super().read_page(lane, positions, seals, rows_per_shard)
        self.reads.append((self.manual.now(), len(rows)))
        return rows

    async def advance(self, lane, moves, acked_at=None):
        self.advances.append((self.manual.now(), lane))
        return await super().advance(lane, moves, acked_at)


class FailingFirstSend(SpyPublisher):
    """The first hand-over is answered with an unknown outcome for every row (nothing reaches the broker)."""

    async def send(self, items):
        if self.sends:
            return await super().send(items)
        self.sends.append((self.clock.now(), [item[1] for item in items]))
        failed: asyncio.Future = asyncio.get_running_loop().create_future()
        failed.set_result([TimeoutError("no answer: outcome unknown")] * len(items))
        return failed


async def test_staged_instants_reach_both_rows_to_the_microsecond(pool, clock, target, acme):
    # The materializer stages instants as epoch microseconds (int8) and its statement turns them back: every
    # instant an occurrence and its ahead row carry is the one the plan computed, sub-second parts included.
    strict_at = AT + timedelta(microseconds=123_457)
    strict = await create_once(pool, clock, target, at=strict_at, max_lateness="90s")
    flexible = await create_once(pool, clock, target, at=strict_at, priority="flexible", flexible_window="7s")
    _, ownership = await owning(pool, clock)
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (2, 0)
    for schedule, window in ((strict, None), (flexible, timedelta(seconds=7))):
        occurrence = await pool.fetchrow(
            "SELECT * FROM occurrences WHERE schedule_id = $1", uuid.UUID(schedule["schedule_id"])
        )
        row = await pool.fetchrow("SELECT * FROM dispatch_queue WHERE occurrence_id = $1", occurrence["occurrence_id"])
        available_at = strict_at + (jitter_offset(occurrence["occurrence_id"], window) if window else timedelta(0))
        assert occurrence["scheduled_for"] == row["scheduled_for"] == strict_at
        assert occurrence["available_at"] == row["available_at"] == available_at
        assert row["bucket"] == bucket_of(available_at) and row["bucket"].microsecond == 0
        assert row["late_after"] == available_at + timedelta(seconds=90 if window is None else 60)
        message = decode_occurrence(row["message"])
        assert (message.scheduled_for, message.available_at) == (strict_at, available_at)


async def _in_one_shard(
    pool, clock, target, strict: int, strict_at: datetime = AT, flexible: int = 0
) -> tuple[ShardOwnership, set[bytes]]:
    """``strict`` schedules due at ``strict_at`` and ``flexible`` ones due by AT + 1 s (a 1 s window), all in
    shard 3, materialized into the ahead lane by a node owning every shard; the strict rows' message keys."""
    for _ in range(strict):
        await create_once(pool, clock, target, at=strict_at)
    for _ in range(flexible):
        await create_once(pool, clock, target, priority="flexible", flexible_window="1s")
    await pool.execute("UPDATE schedules SET shard = 3")
    _, ownership = await owning(pool, clock)
    report = await Materializer(pool, MaterializerConfig(), clock, ownership=ownership).run_once()
    assert (report.ahead, report.late) == (strict + flexible, 0)
    rows = await pool.fetch("SELECT message_key FROM dispatch_queue WHERE lane = 'strict'")
    return ownership, {r["message_key"] for r in rows}


async def _twelve_in_one_shard(pool, clock, target) -> tuple[ShardOwnership, list[bytes]]:
    """Twelve ahead-lane rows due at AT in one shard; their message keys in key (weighted round) order."""
    ownership, _ = await _in_one_shard(pool, clock, target, strict=12)
    order = await pool.fetch("SELECT message_key FROM dispatch_queue ORDER BY shard, bucket, wrr_round, occurrence_id")
    return ownership, [r["message_key"] for r in order]


async def _reading_ahead(
    pool, clock, spy: SpyPublisher, ownership: ShardOwnership, stop: asyncio.Event | None = None
) -> tuple[AheadRelay, SpyStore, asyncio.Task]:
    """A relay with one page in flight of two rows per shard, its pass started 0.9 s before AT (sealed up to
    AT + 1 s: six pages of two rows are readable); returned once it read all twelve rows ahead, or its pass
    ended."""
    store = SpyStore(pool, clock, ownership.node_id)
    config = AheadRelayConfig(read_ahead=timedelta(seconds=2), rows_per_shard=2, pages_in_flight=1)
    relay = AheadRelay(store, spy, ownership, config, clock)
    clock.set(AT - timedelta(seconds=0.9))
    task = asyncio.create_task(relay.run_once(stop))
    await wait_for(lambda: sum(n for _, n in store.reads) == 12 or task.done(), 10)
    return relay, store, task


async def test_a_burst_sealed_before_its_instant_is_read_before_it_and_handed_over_in_order(
    pool, clock, publisher, target, acme
):
    """Pages beyond pages_in_flight are read while the first waits for its instant (read_ahead_rows), so at
    the instant nothing is left to read; they are still handed over one page in flight at a time, in order."""
    ownership, keys = await _twelve_in_one_shard(pool, clock, target)
    spy = SpyPublisher(publisher, clock)
    relay, store, task = await _reading_ahead(pool, clock, spy, ownership)
    assert sum(n for _, n in store.reads) == 12, f"read before the instant: {store.reads}"
    assert spy.sends == [] and not task.done()
    assert relay.handed_over_within(1.0) == 0  # all read, nothing handed over yet
    clock.set(AT)
    assert (await asyncio.wait_for(task, 20)).published == 12
    assert relay.handed_over_within(1.0) == 12  # what the settle pass asks before it runs (a burst here)
    assert all(n == 0 for at, n in store.reads if at >= AT), "rows were read at the instant, not before it"
    assert [len(sent) for _, sent in spy.sends] == [2] * 6
    assert [key for _, sent in spy.sends for key in sent] == keys


async def test_rows_handed_over_count_as_unlogged_until_their_page_is_logged(pool, clock, publisher, target, acme):
    """A burst's log entries trail its hand-overs by seconds (a 500,000 top: last hand-over ~1.5 s, last
    acknowledgement 2.75 s, last log entry 3.96 s after it), and until then only the node itself knows it is
    still dispatching: the settle passes ask it (and other nodes read its announcement), not the log."""
    ownership, _ = await _twelve_in_one_shard(pool, clock, target)
    seen: list[tuple[int, int]] = []

    async def at_acknowledgement() -> None:  # a page acknowledged, its cursor and log entry not written yet
        logged = await pool.fetchval("SELECT coalesce(sum(rows), 0) FROM dispatch_log")
        seen.append((relay.unlogged_rows(), logged))

    config = AheadRelayConfig(read_ahead=timedelta(seconds=2), rows_per_shard=2, pages_in_flight=1)
    hooks = AheadRelayHooks(after_publish=at_acknowledgement)
    relay = AheadRelay(AheadLaneStore(pool, clock, ownership.node_id), publisher, ownership, config, clock, hooks=hooks)
    assert relay.unlogged_rows() == 0
    clock.set(AT)
    assert (await relay.run_once()).published == 12
    assert [logged for _unlogged, logged in seen] == [0, 2, 4, 6, 8, 10]
    # At each acknowledgement at least that page's two rows were handed over and not logged; never more than
    # the twelve minus those logged.
    assert all(2 <= unlogged <= 12 - logged for unlogged, logged in seen), seen
    assert relay.unlogged_rows() == 0, "every page logged"


async def test_pages_read_ahead_are_read_again_after_a_failed_pass_none_skipped_none_sent_twice_unasked(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    """The first page's hand-over fails (outcome unknown) while five more pages wait, read ahead: the pass
    stops, the pages that had not handed anything over are dropped, and everything is read again from the
    cursor. Every row reaches the broker; twice only the rows of the one page whose turn came meanwhile (a
    page in flight is republished after a failure before it, as always), never those read ahead."""
    ownership, keys = await _twelve_in_one_shard(pool, clock, target)
    spy = FailingFirstSend(publisher, clock)
    relay, _, task = await _reading_ahead(pool, clock, spy, ownership)
    clock.set(AT)
    first = await asyncio.wait_for(task, 20)
    assert (first.failed, first.published) == (1, 0)  # one shard blocked at its first row
    assert (await relay.run_once()).published == 12
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=12)
    assert sorted(set(r.key for r in records)) == sorted(keys)
    assert len(records) - len(keys) <= 2, "pages read ahead were published twice"


async def test_a_relay_stopped_while_pages_wait_for_their_instant_stops_at_once_and_loses_nothing(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    """Pages read ahead wait for their instant; the relay is asked to stop: it does not wait for the instant
    to hand them over, and nothing is lost — the next pass (or the shard's next owner) reads them again."""
    ownership, keys = await _twelve_in_one_shard(pool, clock, target)
    spy = SpyPublisher(publisher, clock)
    stop = asyncio.Event()
    relay, _, task = await _reading_ahead(pool, clock, spy, ownership, stop)
    stop.set()
    stopped = await asyncio.wait_for(task, 5)  # the clock never reaches AT: nothing may wait for it
    assert stopped.published == 0 and spy.sends == []
    clock.set(AT)
    assert (await relay.run_once()).published == 12
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=12)
    assert sorted(r.key for r in records) == sorted(keys)


class HeldAnswers(SpyPublisher):
    """A broker slow to acknowledge: every hand-over reaches it at once, its answer is held until ``answering``
    is set."""

    def __init__(self, inner: LibrdkafkaPublisher, clock: ManualClock) -> None:
        super().__init__(inner, clock)
        self.answering = asyncio.Event()
        self._holders: list[asyncio.Task] = []

    async def send(self, items):
        answer = await super().send(items)
        held: asyncio.Future = asyncio.get_running_loop().create_future()

        async def hold() -> None:
            await self.answering.wait()
            held.set_result(await answer)

        self._holders.append(asyncio.create_task(hold()))
        return held


async def test_strict_rows_readable_after_a_flexible_backlog_go_to_the_broker_before_the_rest_of_it(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    """A flexible backlog is read ahead and waits for a slow broker's answers (one page in flight); strict rows
    that become readable a second later take the next free slot, before the flexible pages read before them
    (strict is served first when both are backlogged), and every row is published once."""
    ownership, strict = await _in_one_shard(pool, clock, target, 2, AT + timedelta(seconds=3), flexible=12)
    spy = HeldAnswers(publisher, clock)
    store = SpyStore(pool, clock, ownership.node_id)
    config = AheadRelayConfig(read_ahead=timedelta(seconds=2), rows_per_shard=2, pages_in_flight=1)
    relay = AheadRelay(store, spy, ownership, config, clock)
    clock.set(AT + timedelta(seconds=1))  # every flexible row is due; sealed up to AT + 3 s: no strict row yet
    task = asyncio.create_task(relay.run_once())
    await wait_for(lambda: sum(n for _, n in store.reads) == 12 and len(spy.sends) == 1, 10)
    clock.set(AT + timedelta(seconds=2.5))  # sealed up to AT + 4 s: the strict rows are read
    await wait_for(lambda: sum(n for _, n in store.reads) == 14, 10)
    clock.set(AT + timedelta(seconds=3))
    looked = clock.reads
    await wait_for(lambda: clock.reads > looked + 50)  # the strict page has seen its rows due
    spy.answering.set()
    assert (await asyncio.wait_for(task, 20)).published == 14
    lanes = ["strict" if set(keys) <= strict else "flexible" for _, keys in spy.sends]
    assert lanes[:2] == ["flexible", "strict"], f"strict rows waited behind the flexible backlog: {lanes}"
    assert sorted(strict) == sorted(k for _, keys in spy.sends[1:2] for k in keys)
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=14)
    assert len(records) == len({r.key for r in records}) == 14


async def _strict_ahead_and_flexible_due(pool, clock, publisher, target, stop: asyncio.Event | None = None):
    """Four strict rows due at AT + 3 s and two flexible rows due by AT + 1 s, in one shard; a relay of one page
    in flight of two rows per shard, its pass started at AT + 1.2 s (sealed up to AT + 4 s: two strict pages
    are read, then the flexible one), returned once its first hand-over went out (or its pass ended)."""
    ownership, strict = await _in_one_shard(pool, clock, target, 4, AT + timedelta(seconds=3), flexible=2)
    spy = SpyPublisher(publisher, clock)
    store = SpyStore(pool, clock, ownership.node_id)
    config = AheadRelayConfig(read_ahead=timedelta(seconds=3), rows_per_shard=2, pages_in_flight=1)
    relay = AheadRelay(store, spy, ownership, config, clock)
    clock.set(AT + timedelta(seconds=1.2))
    task = asyncio.create_task(relay.run_once(stop))
    await wait_for(lambda: len(spy.sends) == 1 or task.done(), 10)
    return relay, store, spy, strict, task


async def test_due_flexible_rows_are_not_held_up_behind_strict_pages_read_ahead_of_their_instant(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    """Strict pages read ahead wait for their instant (a burst read before the top) and hold nothing while they
    wait: a flexible page read after them, whose rows are due, goes to the broker at once, not after the strict
    burst's instant (one page in flight), and its lane's cursor moves then, not after the strict pages."""
    _, store, spy, strict, task = await _strict_ahead_and_flexible_due(pool, clock, publisher, target)
    assert [n for _, n in store.reads if n] == [2, 2, 2], "two strict pages and the flexible one, in that order"
    at, keys = spy.sends[0]
    assert at == AT + timedelta(seconds=1.2) and not set(keys) & strict, "due flexible rows waited for the strict"
    # Each lane's cursor moves over its own pages: the flexible page is recorded while the strict ones wait.
    await wait_for(lambda: store.advances, 10)
    assert store.advances == [(AT + timedelta(seconds=1.2), "flexible")]
    clock.set(AT + timedelta(seconds=3))
    assert (await asyncio.wait_for(task, 20)).published == 6
    assert [set(keys) <= strict for _, keys in spy.sends] == [False, True, True]
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=6)
    assert len(records) == len({r.key for r in records}) == 6


async def test_a_relay_stopped_records_a_later_lanes_hand_over_even_while_an_earlier_page_waits(
    pool, clock, publisher, target, kafka_bootstrap, acme
):
    """A flexible page hands its rows over while the strict pages read before it wait for their instant; the
    relay is asked to stop: the flexible page's acknowledged rows move their lane's cursor (they are not read
    and published again), the strict pages are dropped and read again by the next pass."""
    stop = asyncio.Event()
    relay, _, spy, strict, task = await _strict_ahead_and_flexible_due(pool, clock, publisher, target, stop)
    stop.set()
    stopped = await asyncio.wait_for(task, 5)
    assert stopped.published == 2 and len(spy.sends) == 1
    clock.set(AT + timedelta(seconds=3))
    assert (await relay.run_once()).published == 4
    records = await read_topic(kafka_bootstrap, occurrence_topic(target), expected=6)
    assert len(records) == len({r.key for r in records}) == 6, "a row acknowledged before the stop went twice"


class CountingBacklogStore(AheadLaneStore):
    """The real store, counting how often the backlog was counted in the database."""

    counted = 0

    async def backlog(self):
        self.counted += 1
        return await super().backlog()


async def test_one_node_counts_the_backlog_of_every_shard_and_the_others_report_zero(
    pool, clock, publisher, target, acme, telemetry
):
    # Twelve due rows in shard 3, which neither node owns: the count still covers them (an unowned shard's
    # rows are the outage the gauge is for). The owner of shard 0 counts; the other node records 0 without
    # a query, so the gauge summed (or maxed) over nodes is the backlog, never twice it.
    await _twelve_in_one_shard(pool, clock, target)
    clock.set(AT + timedelta(seconds=1))
    relays = {}
    for node, shards in (("node-a", {0: 1}), ("node-b", {1: 1})):
        ownership = ShardOwnership(node)
        ownership.replace(shards)
        store = CountingBacklogStore(pool, clock, node)
        instruments = Telemetry().instruments("relay") if node == "node-b" else telemetry.instruments("relay")
        relays[node] = (AheadRelay(store, publisher, ownership, AheadRelayConfig(), clock, **instruments), store)
    assert await relays["node-a"][0].record_backlog() == {"strict": 12, "flexible": 0}
    assert await relays["node-b"][0].record_backlog() == {"strict": 0, "flexible": 0}
    assert (relays["node-a"][1].counted, relays["node-b"][1].counted) == (1, 0)
    points = {p.attributes["lane"]: p.value for p in telemetry.points("chronoq.ahead_backlog")}
    assert points == {"strict": 12, "flexible": 0}
    # Shard 0 moves to node-b: it counts now, and node-a reports 0 instead of its last count.
    relays["node-a"][0].ownership.replace({1: 2})
    relays["node-b"][0].ownership.replace({0: 2})
    assert await relays["node-b"][0].record_backlog() == {"strict": 12, "flexible": 0}
    assert await relays["node-a"][0].record_backlog() == {"strict": 0, "flexible": 0}
    assert (relays["node-a"][1].counted, relays["node-b"][1].counted) == (1, 1)
    points = {p.attributes["lane"]: p.value for p in telemetry.points("chronoq.ahead_backlog")}
    assert points == {"strict": 0, "flexible": 0}


async def test_a_late_renewal_is_logged_with_where_its_time_went_and_every_gap_is_a_metric(pool, engine_db, caplog):
    """A renewal past half the ttl is the warning an operator needs before the lease is lost: it says how long
    the node waited for a connection and how long the statements took."""
    telemetry = Telemetry()
    config = ShardLeaseConfig(interval=0.1, lease_ttl=0.6, max_moves=256)
    one = await create_pool(engine_db, min_size=1, max_size=1)
    try:
        meter = telemetry.instruments("engine")["meter"]
        leases = ShardLeases(one, ShardOwnership("node-late"), config, DatabaseClock(), meter=meter)
        await leases.run_once()
        caplog.set_level(logging.WARNING, logger="chronoq.shard_leases")
        async with one.acquire():  # every connection of its pool busy for longer than half the ttl
            late = asyncio.create_task(leases.run_once())
            await asyncio.sleep(0.5)
            assert not late.done()
        assert len((await late).lost) == 0
    finally:
        await one.close()
    [warning] = [r for r in caplog.records if getattr(r, "action", None) == "shard.renewal_late"]
    assert warning.connection_wait_s >= 0.45 and warning.gap_s >= warning.connection_wait_s
    [gaps] = telemetry.points("chronoq.shard_renewal_gap")
    assert gaps.count == 2 and gaps.max >= 0.5


async def test_the_leases_renew_while_every_connection_of_the_node_pool_is_held(
    pool, engine_db, kafka_bootstrap, target, acme
):
    """The node's pool can be all busy at a burst's top (pages in flight, settling, a materializer pass held up
    by a checkpoint): the leases renew on a connection of their own, or the node would lose its shards."""
    clock = DatabaseClock()
    due = (datetime.now(UTC) + timedelta(seconds=20)).isoformat()
    await ControlPlane(pool, clock).create_schedule("acme", {"kind": "once", "target": target, "expression": due})
    holding, release, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hold_the_only_connection() -> None:  # the materializer's transaction holds the pool's one connection
        holding.set()
        await release.wait()

    config = DataPlaneConfig(
        node_id="node-busy",
        leases=ShardLeaseConfig(interval=0.2, lease_ttl=1.0, max_moves=256),
        pool_size=1,
        materializer_hooks=MaterializerHooks(after_lock=hold_the_only_connection),
    )
    async with AsyncExitStack() as resources:
        runs = await open_data_plane(
            resources, engine_db, kafka_bootstrap, stop, config, MaterializerConfig(idle_interval=0.05), clock
        )
        tasks = [asyncio.create_task(runs[name]()) for name in ("shard-leases", "materializer")]
        try:
            await asyncio.wait_for(holding.wait(), 15)
            expiry = "SELECT min(expires_at) FROM shard_leases WHERE owner = 'node-busy'"
            before = await pool.fetchval(expiry)

            async def renewed() -> bool:
                after = await pool.fetchval(expiry)
                return after is not None and after > before

            await wait_for(renewed, timeout=3.0)
            assert await pool.fetchval("SELECT count(*) FROM shard_leases WHERE owner = 'node-busy'") == 256
        finally:
            release.set()
            stop.set()
            await asyncio.gather(*tasks)


LIVE_LEASES = "SELECT count(*) FROM shard_leases WHERE owner = $1 AND expires_at > now()"


@asynccontextmanager
async def leasing_node(
    pool: asyncpg.Pool, engine_db: str, kafka_bootstrap: str, node_id: str, **leases: Any
) -> AsyncIterator[None]:
    """A node's shard-lease loop, as open_data_plane runs it (its own thread and connection), entered once the node
    holds all 256 shards live; stopped (its leases released) when the block ends."""
    stop = asyncio.Event()
    config = DataPlaneConfig(node_id=node_id, leases=ShardLeaseConfig(interval=0.1, max_moves=256, **leases))
    async with AsyncExitStack() as resources:
        runs = await open_data_plane(resources, engine_db, kafka_bootstrap, stop, config, None, DatabaseClock())
        task = asyncio.create_task(runs["shard-leases"]())
        try:
            await wait_for(lambda: all_live(pool, node_id), timeout=10)
            yield
        finally:
            stop.set()
            await task


async def all_live(pool: asyncpg.Pool, node_id: str) -> bool:
    return await pool.fetchval(LIVE_LEASES, node_id) == 256


async def test_a_lease_round_never_waits_for_the_wal_to_reach_disk(pool, engine_db, kafka_bootstrap):
    """A renewal that waits for a WAL flush behind a materializer's large commit is late by the flush (2.9-3.4 s
    measured at the top of a burst): the lease connection commits asynchronously (LEASE_SERVER_SETTINGS),
    so its backend writes WAL records but never syncs them itself, while the node's other connections do."""
    async with leasing_node(pool, engine_db, kafka_bootstrap, "node-async", lease_ttl=2.0):
        lease_pid = await pool.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'chronoq-leases node-async'"
        )
        wal_of = """SELECT (SELECT wal_records FROM pg_stat_get_backend_wal($1)) AS records,
                           (SELECT sum(fsyncs) FROM pg_stat_get_backend_io($1) WHERE object = 'wal') AS fsyncs"""

        async def reported() -> bool:  # a backend reports its statistics about once a second
            return (await pool.fetchrow(wal_of, lease_pid))["records"] > 0

        await wait_for(reported, timeout=10)
        async with pool.acquire() as control:  # a synchronous commit, as every other data-plane write is
            await control.execute("UPDATE engine_nodes SET heartbeat_at = heartbeat_at WHERE node_id = 'node-async'")
            await control.execute("SELECT pg_stat_force_next_flush()")
            await control.execute("SELECT 1")
            assert (await control.fetchrow(wal_of, control.get_server_pid()))["fsyncs"] > 0
        assert (await pool.fetchrow(wal_of, lease_pid))["fsyncs"] == 0


def _from_another_thread(database_url: str, query: str, *args: object) -> object:
    """``query``'s value read on a thread of its own: the test's event loop is the one being held."""
    result: list[object] = []

    async def read() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            result.append(await conn.fetchval(query, *args))
        finally:
            await conn.close()

    reader = threading.Thread(target=lambda: asyncio.run(read()))
    reader.start()
    reader.join(30)
    return result[0]


async def test_the_leases_renew_while_the_node_event_loop_is_held(pool, engine_db, kafka_bootstrap, caplog):
    """A burst runs a node's loop seconds late; the leases renew on a thread of their own, so a loop held for
    twice the ttl keeps every shard (on the node's loop the leases would expire and move)."""
    async with leasing_node(pool, engine_db, kafka_bootstrap, "node-held", lease_ttl=1.0, loop_stall_limit=10):
        epochs = await pool.fetchval("SELECT sum(epoch) FROM shard_leases")
        time.sleep(2.0)  # the node's loop held for twice the ttl
        assert _from_another_thread(engine_db, LIVE_LEASES, "node-held") == 256
        assert await pool.fetchval("SELECT sum(epoch) FROM shard_leases") == epochs  # nothing moved
    assert await pool.fetchval("SELECT count(*) FROM shard_leases WHERE owner IS NOT NULL") == 0  # released


async def test_a_wedged_node_loop_lets_its_leases_expire_and_takes_shards_again_when_back(
    pool, engine_db, kafka_bootstrap, caplog
):
    """A loop that stops ticking for loop_stall_limit is a wedged node: its lease thread stops heartbeating and
    renewing, so the shards expire and can move; once the loop runs again the node leases shards again."""
    caplog.set_level(logging.WARNING, logger="chronoq.shard_leases")
    async with leasing_node(pool, engine_db, kafka_bootstrap, "node-wedged", lease_ttl=1.0, loop_stall_limit=1):
        time.sleep(3.0)  # wedged: standing down after 1 s, the last renewal expired a second later
        assert _from_another_thread(engine_db, LIVE_LEASES, "node-wedged") == 0
        alive = "SELECT count(*) FROM engine_nodes WHERE node_id = $1 AND expires_at > now()"
        assert _from_another_thread(engine_db, alive, "node-wedged") == 0  # no heartbeat either: to the others, dead
        await wait_for(lambda: all_live(pool, "node-wedged"), timeout=10)
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "shard.loop_wedged" in actions and "shard.loop_back" in actions


async def test_passes_in_flight_share_the_shards_and_never_touch_the_same_one(pool, clock, target, acme):
    """A node runs passes_in_flight passes at once, so one pass's Python plans while another's statement runs:
    each takes only its share of the owned shards (shard % n), and the shares cover every shard once."""
    for _ in range(40):
        await create_once(pool, clock, target)
    shards = {r["shard"] for r in await pool.fetch("SELECT shard FROM schedules")}
    assert {s % 2 for s in shards} == {0, 1}, "forty schedules land on even and odd shards"
    _, ownership = await owning(pool, clock)
    materializer = Materializer(pool, MaterializerConfig(), clock, ownership=ownership)

    even = await materializer.run_once((0, 2))
    written = {r["shard"] for r in await pool.fetch("SELECT DISTINCT shard FROM dispatch_queue")}
    assert written and all(s % 2 == 0 for s in written)
    odd = await materializer.run_once((1, 2))
    assert even.ahead + odd.ahead == 40 and not even.skipped and not odd.skipped
    assert await pool.fetchval("SELECT count(*) FROM occurrences") == 40


async def test_the_materializer_loop_runs_its_passes_at_once(pool, clock, target, acme):
    """Both passes hold their transactions at the same time (each its seal locks, on its own shards), and
    together they write every due schedule's occurrence once."""
    for _ in range(40):
        await create_once(pool, clock, target)
    _, ownership = await owning(pool, clock)
    inside, both, stop = [0], asyncio.Event(), asyncio.Event()

    async def after_lock() -> None:
        inside[0] += 1
        if inside[0] == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 10)  # each pass waits, seals held, until the other is inside too

    materializer = Materializer(
        pool,
        MaterializerConfig(idle_interval=0.05, passes_in_flight=2),
        clock,
        ownership=ownership,
        hooks=MaterializerHooks(after_lock=after_lock),
    )
    task = asyncio.create_task(materializer.run(stop))
    try:
        await wait_for(lambda: both.is_set(), timeout=10)

        async def all_written() -> bool:
            return await pool.fetchval("SELECT count(*) FROM dispatch_queue") == 40

        await wait_for(all_written, timeout=10)
    finally:
        stop.set()
        await task
    assert await pool.fetchval("SELECT count(*) FROM occurrences") == 40
