"""The time spec: when a schedule fires, as a hashable value."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from engine.rules.exclusion_calendars import ExclusionCalendar

Kind = Literal["once", "cron", "rate"]
KINDS: tuple[str, ...] = ("once", "cron", "rate")
DST_REPEAT_CHOICES: tuple[str, ...] = ("first", "both")
DST_GAP_CHOICES: tuple[str, ...] = ("skip", "shift")


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """When a schedule fires. Requests build it with
    :func:`engine.control.schedule_requests.build_time_spec` (which validates).

    Hashable: used as a cache key. ``start_at``/``end_at``/``anchor`` are aware UTC.
    """

    kind: Kind
    expression: str  # cron text, ISO-8601 instant, or duration like "15m"/"1h30m"
    time_zone: str = "UTC"  # IANA key
    dst_repeat: Literal["first", "both"] = "first"
    dst_gap: Literal["skip", "shift"] = "skip"
    anchor: datetime | None = None  # rate only: fires at anchor + k*period
    start_at: datetime | None = None  # inclusive bound (aware UTC)
    end_at: datetime | None = None  # inclusive bound (aware UTC)
    # Fires whose date on the calendar's clock is listed are removed (docs/time-contract.md); the
    # durable cursor and the quotas use the spec without it, since the calendar may change.
    calendar: ExclusionCalendar | None = None


@dataclass(frozen=True, slots=True)
class FirePreview:
    """One fire: the UTC instant and the same instant on the schedule's local clock."""

    utc: datetime  # aware UTC
    local: datetime  # aware, in the schedule's zone, with the right fold/offset
    rule: str = ""  # which rule produced it ("day-of-week TUE#2: second Tuesday of the month; ...")
