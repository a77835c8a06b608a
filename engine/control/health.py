"""Health of the engine as the database sees it: lag percentiles, throughput, backlogs.

Read from the engine database, not from one process's metrics, so the
console of any API process shows the whole system (materializers and relays
run elsewhere in production). Scoped by tenant (None: every tenant). The
last-hour reads use the (tenant_id, scheduled_for) index of migration 0004.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from engine.control.views import instant
from schemas.queries import QUERIES


@dataclass(frozen=True)
class Health:
    now: datetime
    minutes: int
    lag: dict[str, float | None]  # p50, p95, p99 in seconds over the window
    enqueued: int
    backlogs: dict[str, Any]
    series: list[dict[str, Any]]  # one per minute, oldest first (gaps filled with zeros)

    def to_json(self) -> dict[str, Any]:
        return {
            "now": instant(self.now),
            "minutes": self.minutes,
            "lag_seconds": self.lag,
            "enqueued": self.enqueued,
            "backlogs": self.backlogs,
            "series": [{**point, "minute": instant(point["minute"])} for point in self.series],
        }


async def read_health(pool: asyncpg.Pool, tenant_id: str | None, now: datetime, minutes: int = 60) -> Health:
    lag_row = await pool.fetchrow(*QUERIES.health_lag(tenant_id=tenant_id, minutes=minutes, now=now))
    percentiles = list(lag_row["lag"] or [None, None, None])
    backlogs = dict(await pool.fetchrow(*QUERIES.backlogs(tenant_id=tenant_id, now=now)))
    if backlogs["queue_age_s"] is not None:
        backlogs["queue_age_s"] = round(float(backlogs["queue_age_s"]), 3)
    rows = {
        row["minute"]: row
        for row in await pool.fetch(*QUERIES.health_minutes(tenant_id=tenant_id, minutes=minutes, now=now))
    }
    end = now.replace(second=0, microsecond=0)
    series = []
    for offset in range(minutes - 1, -1, -1):
        minute = end - timedelta(minutes=offset)
        row = rows.get(minute)
        series.append(
            {
                "minute": minute,
                **{
                    name: (row[name] if row else 0)
                    for name in ("occurrences", "enqueued", "succeeded", "dead", "missed")
                },
                "lag_p50": _round(row["lag_p50"]) if row else None,
                "lag_p99": _round(row["lag_p99"]) if row else None,
            }
        )
    return Health(
        now,
        minutes,
        {"p50": _round(percentiles[0]), "p95": _round(percentiles[1]), "p99": _round(percentiles[2])},
        lag_row["enqueued"],
        backlogs,
        series,
    )


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
