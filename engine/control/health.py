"""Health of the engine as the database sees it: lag percentiles, throughput, backlogs.

Read from the engine database, not from one process's metrics, so the
console of any API process shows the whole system (materializers and relays
run elsewhere in production). Scoped by tenant (None: every tenant). The
last-hour window is read once (``health_window``): finished occurrences by
tenant and time (migration 0029), open ones from ``occurrences_open``.
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
    window = await pool.fetch(*QUERIES.health_window(tenant_id=tenant_id, minutes=minutes, now=now))
    whole = next(row for row in window if row["whole"])
    percentiles = list(whole["lag"] or [None, None, None])
    backlogs = dict(await pool.fetchrow(*QUERIES.backlogs(tenant_id=tenant_id, now=now)))
    if backlogs["queue_age_s"] is not None:
        backlogs["queue_age_s"] = round(float(backlogs["queue_age_s"]), 3)
    rows = {row["minute"]: row for row in window if not row["whole"]}
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
                "lag_p50": _round(row["lag"][0]) if row and row["lag"] else None,
                "lag_p99": _round(row["lag"][2]) if row and row["lag"] else None,
            }
        )
    return Health(
        now,
        minutes,
        {"p50": _round(percentiles[0]), "p95": _round(percentiles[1]), "p99": _round(percentiles[2])},
        whole["enqueued_slots"],
        backlogs,
        series,
    )


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
