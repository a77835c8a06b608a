"""Durations as written in schedules: ``"90s"``, ``"15m"``, ``"1h30m"``, ``"2d12h"``."""

from __future__ import annotations

import re
from datetime import timedelta

from schemas.errors import InvalidInput

MAX_DURATION = timedelta(days=3660)
_DURATION = re.compile(r"^(?:(\d{1,7})d)?(?:(\d{1,7})h)?(?:(\d{1,7})m)?(?:(\d{1,7})s)?$")


def parse_duration(text: object, field: str = "expression") -> timedelta:
    """Parse ``"90s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"1h30m"``, ``"2d12h"`` (units in d h m s order).

    Whole seconds only, zero allowed (callers that need a positive value say so),
    at most 3660 days. Raises :class:`InvalidInput` for ``field``.
    """
    if not isinstance(text, str):
        raise InvalidInput(field, f"must be a duration string, got {type(text).__name__}", "1h30m")
    raw = "".join(text.split()).lower()
    shown = text.strip()[:30]
    if not raw:
        raise InvalidInput(field, "is empty; give a duration with units d, h, m, s", "15m")
    if raw.startswith("-"):
        raise InvalidInput(field, f"{shown!r} is negative; a duration must be positive", "15m")
    if re.fullmatch(r"\d+", raw):
        raise InvalidInput(field, f"{shown!r} has no unit; use d, h, m or s", f"{raw}s")
    if re.search(r"\d(ms|us|µs|ns)$", raw) or re.search(r"\d[.,]\d", raw):
        raise InvalidInput(field, f"{shown!r} is fractional or below one second; the smallest unit is 1s", "1s")
    match = _DURATION.match(raw)
    if match is None or not any(match.groups()):
        raise InvalidInput(
            field, f"{shown!r} is not a duration; write numbers with units d, h, m, s in that order", "1h30m"
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if total > MAX_DURATION:
        raise InvalidInput(field, f"{shown!r} is longer than the limit of {MAX_DURATION.days}d", "30d")
    return total
