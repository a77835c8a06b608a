"""The settle pass waits while a burst is still being dispatched, judged by when relays logged their pages,
not by when the broker acknowledged them (a relay busy handing a burst over logs its pages late)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg

from engine.loops.dispatch_settler import DispatchSettler, SettlerConfig
from schemas.clock import ManualClock


async def log_page(pool: asyncpg.Pool, clock: ManualClock, acked_ago: float, logged_ago: float) -> None:
    """One unsettled log entry: acknowledged and logged that many seconds before the clock's instant."""
    now, key = clock.now(), uuid.uuid4()
    await pool.execute(
        "INSERT INTO dispatch_log (shard, lane, epoch, from_bucket, from_round, from_id, to_bucket, to_round,"
        " to_id, rows, acked_at, logged_at) VALUES (1, 'strict', 1, $1, 0, $2, $1, 0, $2, 64, $3, $4)",
        now - timedelta(seconds=60),
        key,
        now - timedelta(seconds=acked_ago),
        now - timedelta(seconds=logged_ago),
    )


async def test_a_page_logged_just_now_defers_the_settle_pass_though_acknowledged_seconds_ago(pool, clock):
    """In the 300,000 hour-top the relays logged pages up to 3 s after the top, each a second or more after its
    acknowledgement: judged by acked_at the burst looked over at 2 s and the settle's UPDATEs ran in it."""
    settler = DispatchSettler(pool, SettlerConfig(busy_window=1.0, max_defer=30.0), clock)
    assert not await settler.deferred()  # nothing logged: nothing to wait for
    await log_page(pool, clock, acked_ago=2.5, logged_ago=0.1)
    assert await settler.deferred(), "a relay logged a page 0.1 s ago: a burst is still being dispatched"
    clock.advance(timedelta(seconds=1.5))
    assert not await settler.deferred(), "no page logged for 1.6 s: the burst is over"


async def test_the_settle_pass_waits_no_longer_than_max_defer(pool, clock):
    settler = DispatchSettler(pool, SettlerConfig(busy_window=1.0, max_defer=30.0), clock)
    await log_page(pool, clock, acked_ago=31.0, logged_ago=31.0)  # unsettled for longer than max_defer
    await log_page(pool, clock, acked_ago=0.5, logged_ago=0.1)
    assert not await settler.deferred(), "steady dispatch must not keep the log unsettled past max_defer"
