"""`chronoq engine --horizon` reaches the materializer of the process it starts: a deployment sized for a
large burst writes occurrences that far ahead, into the ahead lane, and not further.

The library's 30 s default would leave a fire 90 s away unwritten; with ``--horizon 2m`` it is written
(and shard-leased, so into the ahead lane) within seconds of the engine taking its shards, while a fire
five minutes away is not.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from engine.control.schedules import ControlPlane
from schemas.messages import format_instant
from tests.support.engine_process import start_engine, stop_engine
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.on_broker("tansu")]  # the materializer's wiring, not the broker's


async def once_at(control: ControlPlane, target: str, at_s: float, now: datetime) -> str:
    schedule = await control.create_schedule(
        "acme", {"kind": "once", "target": target, "expression": format_instant(now + timedelta(seconds=at_s))}
    )
    return schedule["schedule_id"]


async def test_engine_materializes_as_far_ahead_as_its_horizon_flag_says(
    engine_db, pool: asyncpg.Pool, kafka_bootstrap, target, acme, tmp_path: Path
):
    control = ControlPlane(pool)
    now = await control.now()
    near = await once_at(control, target, 90, now)  # beyond the library's 30 s, within 2 minutes
    far = await once_at(control, target, 300, now)  # beyond 2 minutes for the next 3 minutes
    log = tmp_path / "engine.log"
    engine = await start_engine(engine_db, kafka_bootstrap, log, "--horizon", "2m")
    try:
        ahead = await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) FROM dispatch_queue q JOIN occurrences o USING (occurrence_id)"
                " WHERE o.schedule_id = $1::uuid AND o.state = 'SCHEDULED'",
                near,
            ),
            timeout=60,
            interval=0.2,
        )
        assert ahead == 1, log.read_text()[-3000:]
        # The pass that wrote the near one read every schedule due within its horizon: the far one was not.
        assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE schedule_id = $1::uuid", far) == 0
        assert await pool.fetchval("SELECT state FROM schedules WHERE schedule_id = $1::uuid", far) == "active"
    finally:
        await stop_engine(engine)
