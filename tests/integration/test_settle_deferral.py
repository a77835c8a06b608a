"""The settle pass waits while a burst is still being dispatched, also when the relays log its pages late
(a relay busy handing a burst over logs pages a second or more after their acknowledgements), and settles as
it goes under steady traffic."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg

from engine.loops.dispatch_settler import DispatchSettler, SettlerConfig
from schemas.clock import ManualClock
from schemas.queries import QUERIES

CONFIG = SettlerConfig(busy_window=1.0, busy_rows=10_000, max_defer=30.0)


async def log_pages(
    pool: asyncpg.Pool, clock: ManualClock, acked_ago: float, logged_ago: float, entries: int = 1
) -> None:
    """Unsettled log entries of 64 rows each: acknowledged and logged that many seconds before the clock."""
    now = clock.now()
    for _ in range(entries):
        key = uuid.uuid4()
        await pool.execute(
            "INSERT INTO dispatch_log (shard, lane, epoch, from_bucket, from_round, from_id, to_bucket, to_round,"
            " to_id, rows, acked_at, logged_at) VALUES (1, 'strict', 1, $1, 0, $2, $1, 0, $2, 64, $3, $4)",
            now - timedelta(seconds=60),
            key,
            now - timedelta(seconds=acked_ago),
            now - timedelta(seconds=logged_ago),
        )


async def test_a_burst_logged_late_defers_the_settle_pass(pool, clock):
    """In the 300,000 hour-top the relays logged pages until 3 s after the top, each a second or more after its
    acknowledgement: judged by acked_at alone the burst looked over at 2 s and the settle's UPDATEs ran in it."""
    settler = DispatchSettler(pool, CONFIG, clock)
    assert not await settler.deferred()  # nothing logged: nothing to wait for
    await log_pages(pool, clock, acked_ago=2.5, logged_ago=0.1, entries=160)  # 10,240 rows in the last second
    assert await settler.deferred(), "relays logged a burst's pages within the last second"
    clock.advance(timedelta(seconds=1.5))
    assert not await settler.deferred(), "no page logged for 1.6 s: the burst is over"


async def test_steady_traffic_logged_late_settles_as_it_goes(pool, clock):
    """A flexible page spans seconds: it is logged after its last row, its first rows acknowledged long
    before. Under steady traffic that must not hold the settle pass back (the 30-minute soak: the oldest
    unsettled row at most 2.75 s old)."""
    settler = DispatchSettler(pool, CONFIG, clock)
    await log_pages(pool, clock, acked_ago=2.5, logged_ago=0.1, entries=15)  # 960 rows in the last second
    assert not await settler.deferred()
    await log_pages(pool, clock, acked_ago=0.2, logged_ago=0.1)
    assert await settler.deferred(), "a page acknowledged within the last second: dispatch is going on"


async def test_the_settle_pass_waits_no_longer_than_max_defer(pool, clock):
    settler = DispatchSettler(pool, CONFIG, clock)
    await log_pages(pool, clock, acked_ago=31.0, logged_ago=31.0)  # unsettled for longer than max_defer
    await log_pages(pool, clock, acked_ago=0.5, logged_ago=0.1, entries=200)
    assert not await settler.deferred(), "steady dispatch must not keep the log unsettled past max_defer"


async def test_a_burst_this_node_hands_over_defers_the_settle_pass_before_its_log_shows_it(pool, clock):
    """A burst read ahead is handed over by a relay that reads nothing (quiet), and logged seconds after its
    acknowledgements: in an Apache Kafka 500,000 run the settle pass ran inside the burst that way and settled
    59,392 rows (p99 9.1 s against 5.9 s). The node's own count of rows handed over defers it, for at most
    max_defer like every other sign of a burst."""
    handed: list[int] = [0]
    settler = DispatchSettler(pool, CONFIG, clock, quiet=lambda: True, handed_over=lambda _seconds: handed[0])
    await log_pages(pool, clock, acked_ago=5.0, logged_ago=5.0, entries=20)  # the log: nothing for 5 s
    assert not await settler.deferred()
    handed[0] = 10_000  # the relay handed 10,000 rows over within the last second
    assert await settler.deferred(), "this node is handing a burst over"
    handed[0] = 900  # steady traffic
    assert not await settler.deferred()
    handed[0] = 50_000
    clock.advance(timedelta(seconds=26))  # the oldest unsettled entry: acknowledged 31 s ago
    assert not await settler.deferred(), "a burst defers the settle pass for max_defer at most"


async def register(pool: asyncpg.Pool, clock: ManualClock, node: str, ttl_s: float = 6.0) -> None:
    """``node`` heartbeats at the clock's instant, live for ttl_s (the lease loop's own statement)."""
    await pool.execute(*QUERIES.heartbeat_node(node=node, ttl_s=ttl_s, now=clock.now()))


async def test_another_node_handing_a_burst_over_defers_this_nodes_settle_pass(pool, clock):
    """Two nodes share a burst; one hands its share over first. Its settle pass used to start while the other
    was still dispatching — that node's pages reach the log seconds late, the only sign this node could see
    (16,384 rows settled inside a 500,000 burst on tansu, PostgreSQL's CPU per row 4.4 µs against 0.3). The
    busy node now announces its hand-overs where every node's settle pass looks."""
    await register(pool, clock, "node-a")
    await register(pool, clock, "node-b")
    await log_pages(pool, clock, acked_ago=5.0, logged_ago=5.0, entries=20)  # node a's share: logged, quiet since
    done = DispatchSettler(pool, CONFIG, clock, quiet=lambda: True, handed_over=lambda _s: 0, node_id="node-a")
    busy = DispatchSettler(pool, CONFIG, clock, handed_over=lambda _s: 50_000, node_id="node-b")
    assert not await done.deferred(), "nothing in the log or this node says a burst is on"
    assert not await done.announce(), "a node handing nothing over announces nothing"

    assert await busy.announce()
    assert await done.deferred(), "node b is handing a burst over"
    assert not await busy.announce(), "rewritten every half window, not at every pass"

    clock.advance(timedelta(seconds=3.1))
    assert not await done.deferred(), "an announcement lasts three busy_windows: node b stopped announcing"


async def test_an_expired_nodes_announcement_defers_nothing(pool, clock):
    """A node that died mid-burst (its heartbeat lapsed) must not hold every other node's settle pass for the
    rest of its last announcement; max_defer bounds it anyway."""
    await register(pool, clock, "node-a")
    await register(pool, clock, "node-b", ttl_s=0.5)
    await log_pages(pool, clock, acked_ago=5.0, logged_ago=5.0)
    busy = DispatchSettler(
        pool, SettlerConfig(busy_window=10.0, busy_rows=10_000), clock, handed_over=lambda _s: 50_000, node_id="node-b"
    )
    assert await busy.announce()
    done = DispatchSettler(pool, CONFIG, clock, node_id="node-a")
    assert await done.deferred()
    clock.advance(timedelta(seconds=1))
    assert not await done.deferred(), "node b's heartbeat expired: its announcement is void"


async def test_the_settle_loop_announces_while_its_relay_hands_a_burst_over_even_while_it_reads(pool, clock):
    """The announcement comes first in the loop: a relay reading its next pages (not quiet) is handing the
    last ones over all the same."""
    await register(pool, clock, "node-b")
    settler = DispatchSettler(pool, CONFIG, clock, quiet=lambda: False, handed_over=lambda _s: 50_000, node_id="node-b")
    stop = asyncio.Event()
    task = asyncio.create_task(settler.run(stop))
    try:
        async with asyncio.timeout(10):
            while await pool.fetchval("SELECT handing_over_until FROM engine_nodes WHERE node_id = 'node-b'") is None:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    until = await pool.fetchval("SELECT handing_over_until FROM engine_nodes WHERE node_id = 'node-b'")
    assert until == clock.now() + 3 * timedelta(seconds=CONFIG.busy_window)


async def test_rows_handed_over_but_not_logged_keep_the_burst_on_after_the_last_hand_over(pool, clock):
    """The end of a burst: every row handed over more than busy_window ago, its acknowledgements and log entries
    still coming (a 500,000 top: the last log entry 2.5 s after the last hand-over, and a settle pass started
    inside that tail). Rows this node handed over but has not logged keep its own settle pass waiting and its
    announcement going."""
    await register(pool, clock, "node-a")
    await register(pool, clock, "node-b")
    await log_pages(pool, clock, acked_ago=5.0, logged_ago=5.0)
    unlogged = [24_576]
    done = DispatchSettler(pool, CONFIG, clock, node_id="node-a")
    tail = DispatchSettler(
        pool, CONFIG, clock, handed_over=lambda _s: 0, unlogged=lambda: unlogged[0], node_id="node-b"
    )
    assert await tail.deferred(), "this node's burst is not logged yet"
    assert await tail.announce()
    assert await done.deferred(), "nor can another node see it in the log: it sees the announcement"
    unlogged[0] = 8_192  # less than busy_rows: one page, steady traffic's share
    assert not await tail.announce(), "no burst left to announce"
    clock.advance(timedelta(seconds=3.1))  # the last announcement lapsed
    assert not await tail.deferred()
    assert not await done.deferred()


async def unsettled(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM dispatch_log WHERE settled_at IS NULL")


async def test_the_settle_statement_asks_the_deferral_rule_in_its_own_snapshot(pool, clock):
    """The loop checked, then settled in a second statement: in a 500,000 burst the two were seconds apart (the
    node's loop and pool lag there), and a check passed before the top let a settle statement run at +2.44 s
    while both nodes' announcements were valid (8,192 rows settled inside the burst). A gated settle statement
    now judges the rule itself and settles nothing while it says wait; ungated (tools, tests) it settles."""
    await register(pool, clock, "node-a")
    await register(pool, clock, "node-b")
    await log_pages(pool, clock, acked_ago=5.0, logged_ago=5.0, entries=3)
    done = DispatchSettler(pool, CONFIG, clock, node_id="node-a")
    busy = DispatchSettler(pool, CONFIG, clock, handed_over=lambda _s: 50_000, node_id="node-b")
    assert await busy.announce()

    report = await done.run_once(gated=True)
    assert report.deferred and report.entries == 0
    assert await unsettled(pool) == 3, "a gated pass settles nothing while another node announces a burst"
    assert (await busy.run_once(gated=True)).deferred, "nor while this node's own relay hands one over"

    clock.advance(timedelta(seconds=3.1))  # the announcement lapsed
    report = await done.run_once(gated=True)
    assert not report.deferred and report.entries == 3
    assert await unsettled(pool) == 0


async def test_an_ungated_settle_pass_settles_whatever_the_rule_says(pool, clock):
    await log_pages(pool, clock, acked_ago=0.2, logged_ago=0.1, entries=2)  # a page acknowledged just now
    settler = DispatchSettler(pool, CONFIG, clock)
    assert await settler.deferred()
    report = await settler.run_once()
    assert not report.deferred and report.entries == 2


async def test_the_settle_loop_settles_nothing_while_a_burst_is_announced_and_settles_after(pool, clock):
    """The loop's pass is the gated statement: with another node's announcement valid it settles nothing, pass
    after pass; once the announcement lapses it settles the log."""
    await register(pool, clock, "node-a", ttl_s=600)
    await register(pool, clock, "node-b", ttl_s=600)
    await log_pages(pool, clock, acked_ago=5.0, logged_ago=5.0, entries=4)
    busy = DispatchSettler(
        pool, SettlerConfig(busy_window=10.0, busy_rows=10_000), clock, handed_over=lambda _s: 50_000, node_id="node-b"
    )
    assert await busy.announce()  # valid for 30 s of the clock
    passes = [0]

    def quiet() -> bool:  # asked once per pass of the loop
        passes[0] += 1
        return True

    settler = DispatchSettler(pool, SettlerConfig(busy_window=1.0, interval=0.02), clock, quiet=quiet, node_id="node-a")
    stop = asyncio.Event()
    task = asyncio.create_task(settler.run(stop))
    try:
        async with asyncio.timeout(10):
            while passes[0] < 6:  # five whole passes, each of which must defer
                await asyncio.sleep(0.02)
        assert await unsettled(pool) == 4
        clock.advance(timedelta(seconds=31))
        async with asyncio.timeout(10):
            while await unsettled(pool):
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task


async def announce_behind(pool: asyncpg.Pool, clock: ManualClock, until_s: float) -> None:
    """An attempt processor's announcement that consumers are behind, lasting until_s from the clock."""
    await pool.execute(*QUERIES.announce_consumers_behind(until_s=until_s, now=clock.now()))


async def test_consumers_behind_defer_the_settle_pass_for_max_defer_behind_at_most(pool, clock):
    """After a burst the consumers take minutes to start it here, and the settle pass's updates competed with them
    (stop 55). An attempt processor's announcement holds it back, past max_defer, up to max_defer_behind."""
    settler = DispatchSettler(pool, SettlerConfig(max_defer=30.0, max_defer_behind=300.0), clock)
    await log_pages(pool, clock, acked_ago=40.0, logged_ago=40.0, entries=20)  # dispatched 40 s ago, unsettled
    assert not await settler.deferred(), "the burst is dispatched and nobody says consumers are behind"
    await announce_behind(pool, clock, until_s=6.0)
    assert await settler.deferred(), "consumers are working through the burst"
    assert (await settler.run_once(gated=True)).deferred, "the settle statement asks the same rule"
    clock.advance(timedelta(seconds=6.0))
    assert not await settler.deferred(), "the announcement lapsed: the processor stopped renewing it"
    await announce_behind(pool, clock, until_s=600.0)
    assert await settler.deferred()
    clock.advance(timedelta(seconds=254.0))  # the oldest unsettled entry: acknowledged 300 s ago
    assert not await settler.deferred(), "a backlog never keeps the log unsettled past max_defer_behind"
    report = await settler.run_once(gated=True)
    assert not report.deferred and report.entries == 20


async def test_an_announcement_is_raised_never_lowered(pool, clock):
    """Two processors announce: the later instant stands whatever the order of their writes."""
    settler = DispatchSettler(pool, CONFIG, clock)
    await log_pages(pool, clock, acked_ago=40.0, logged_ago=40.0)
    await announce_behind(pool, clock, until_s=20.0)
    await announce_behind(pool, clock, until_s=5.0)
    clock.advance(timedelta(seconds=10.0))
    assert await settler.deferred(), "the shorter announcement written last did not cut the longer one"


async def test_max_defer_behind_zero_never_waits_for_consumers(pool, clock):
    settler = DispatchSettler(pool, SettlerConfig(max_defer_behind=0.0), clock)
    await log_pages(pool, clock, acked_ago=40.0, logged_ago=40.0)
    await announce_behind(pool, clock, until_s=60.0)
    assert not await settler.deferred()
