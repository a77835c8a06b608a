"""A brute-force oracle for the time contract, independent of engine.rules.timing.

It walks UTC minute by minute, converts each minute to the local wall clock
with zoneinfo, and applies the contract's rules by observation rather than by
reasoning about offsets:

* a wall time seen for the first time in the walk fires (if it matches);
* a wall time seen again (the clock went back) fires only with dst_repeat="both";
* wall times the local clock jumped over between two consecutive minutes do
  not exist: with dst_gap="shift" a matching one fires at the minute right
  after the jump; several of them and a regular fire there count once.

The cron matcher below is deliberately naive and shares no code with
engine/cron_expression.py. Slow (one zoneinfo conversion per minute), so keep
windows to a few days.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

UTC = UTC
MINUTE = timedelta(minutes=1)
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _number(token: str, names: list[str] | None, base: int) -> int:
    if names and token.upper() in names:
        return names.index(token.upper()) + base
    return int(token)


def _field(text: str, low: int, high: int, names: list[str] | None = None, base: int = 0) -> set[int]:
    chosen: set[int] = set()
    for part in text.split(","):
        step = 1
        stepped = "/" in part
        if stepped:
            part, step_text = part.split("/")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, b = part.split("-")
            first, last = _number(a, names, base), _number(b, names, base)
        else:
            first = _number(part, names, base)
            last = high if stepped else first  # "5/15" means 5-max/15
        value = first
        while value <= last:
            chosen.add(value)
            value += step
    return chosen


class OracleCron:
    """Naive cron matching on a naive local datetime."""

    def __init__(self, expression: str) -> None:
        expression = SHORTHANDS.get(expression.strip().lower(), expression)
        minute, hour, dom, month, dow = expression.split()
        self.minutes = _field(minute, 0, 59)
        self.hours = _field(hour, 0, 23)
        self.doms = _field(dom, 1, 31)
        self.months = _field(month, 1, 12, MONTHS, 1)
        self.dows = {d % 7 for d in _field(dow, 0, 6, DAYS, 0)}
        # Vixie cron: a day field beginning with "*" makes the two day fields combine with AND.
        self.either_day = not (dom.startswith("*") or dow.startswith("*"))

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours or wall.month not in self.months:
            return False
        dom_ok = wall.day in self.doms
        dow_ok = wall.isoweekday() % 7 in self.dows
        return (dom_ok or dow_ok) if self.either_day else (dom_ok and dow_ok)


def oracle_fire_times(
    expression: str, zone: str, low: datetime, high: datetime, dst_repeat: str = "first", dst_gap: str = "skip"
) -> list[datetime]:
    """Every fire instant t with low < t <= high (aware UTC), by walking minutes."""
    cron = OracleCron(expression)
    tz = ZoneInfo(zone)
    # Start two days early so that the first pass of a repeated hour is seen
    # before its second pass, even when the window starts in between.
    instant = low.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(days=2)
    end = high.astimezone(UTC)
    seen: set[datetime] = set()
    fires: set[datetime] = set()
    previous_wall: datetime | None = None
    while instant <= end:
        wall = instant.astimezone(tz).replace(tzinfo=None, fold=0)
        if previous_wall is not None and wall - previous_wall > MINUTE and dst_gap == "shift":
            skipped = previous_wall + MINUTE
            while skipped < wall:
                if cron.matches(skipped):
                    fires.add(instant)
                skipped += MINUTE
        if cron.matches(wall):
            if wall not in seen or dst_repeat == "both":
                fires.add(instant)
        seen.add(wall)
        previous_wall = wall
        instant += MINUTE
    return sorted(t for t in fires if low < t <= high)


def transitions(zone: str, year: int) -> list[datetime]:
    """UTC instants (to the minute) where the zone's offset changes during ``year``."""
    tz = ZoneInfo(zone)
    found = []
    instant = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    step = timedelta(hours=1)
    offset = instant.astimezone(tz).utcoffset()
    while instant < end:
        following = instant + step
        new_offset = following.astimezone(tz).utcoffset()
        if new_offset != offset:
            low, high = instant, following  # narrow down to the minute
            while high - low > MINUTE:
                middle = low + (high - low) / 2
                middle = middle.replace(second=0, microsecond=0)
                if middle <= low:
                    break
                if middle.astimezone(tz).utcoffset() == offset:
                    low = middle
                else:
                    high = middle
            found.append(high)
            offset = new_offset
        instant = following
    return found
