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
engine/rules/cron_expression.py or cron_day_terms.py. The calendar terms are
tested on the date itself, by looking at the month around it rather than by
arithmetic on the month's length and first weekday:

* ``L``: the next day is in another month; ``L-n``: n days later is still in
  this month and n + 1 days later is not;
* ``nW``: the month has a day n, and this date is the month's Monday-Friday
  closest to it; ``LW``: a Monday-Friday with no later one in the month;
* ``dL``: that weekday, and a week later is another month; ``d#k``: that
  weekday, and exactly k - 1 of them come earlier in the month.

Exclusion calendars: a fire is dropped when the local date of its instant on
the calendar's clock is in the given set of dates. Slow (one zoneinfo
conversion per minute), so keep windows to a few days.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
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


def _day_name(token: str) -> int:
    token = token.upper()
    return DAYS.index(token) if token in DAYS else int(token) % 7


def _weekday(day: date) -> int:
    return day.isoweekday() % 7  # 0 = Sunday


def _same_month(day: date, days_later: int) -> bool:
    return (day + timedelta(days=days_later)).month == day.month


def _month_dates(day: date) -> tuple[date, ...]:
    return _dates_of_month(day.year, day.month)


@lru_cache(maxsize=4096)  # speed only: the dates of a month are found by walking from its 1st
def _dates_of_month(year: int, month: int) -> tuple[date, ...]:
    first = date(year, month, 1)
    return tuple(first + timedelta(days=n) for n in range(31) if (first + timedelta(days=n)).month == month)


def _day_of_month_term(term: str, day: date) -> bool:
    term = term.upper()
    if term == "L":
        return not _same_month(day, 1)
    if term == "LW":
        later = [d for d in _month_dates(day) if d > day]
        return _weekday(day) not in (0, 6) and all(_weekday(d) in (0, 6) for d in later)
    if term.startswith("L-"):
        n = int(term[2:])
        return _same_month(day, n) and not _same_month(day, n + 1)
    if term.endswith("W"):
        n = int(term[:-1])
        month = _month_dates(day)
        if n > len(month):
            return False
        return day == _closest_weekday(n, day.year, day.month)
    raise ValueError(term)


@lru_cache(maxsize=4096)
def _closest_weekday(n: int, year: int, month: int) -> date:
    weekdays = [d for d in _dates_of_month(year, month) if _weekday(d) not in (0, 6)]
    return min(weekdays, key=lambda d: abs(d.day - n))


def _day_of_week_term(term: str, day: date) -> bool:
    term = term.upper()
    if term.endswith("L"):
        return _weekday(day) == _day_name(term[:-1]) and not _same_month(day, 7)
    name, nth = term.split("#")
    earlier = [d for d in _month_dates(day) if d < day and _weekday(d) == _weekday(day)]
    return _weekday(day) == _day_name(name) and len(earlier) == int(nth) - 1


def _is_term(item: str) -> bool:
    stripped = item.upper()
    for name in DAYS:
        stripped = stripped.replace(name, "")
    return any(symbol in stripped for symbol in "LW#")


class OracleCron:
    """Naive cron matching on a naive local datetime."""

    def __init__(self, expression: str) -> None:
        expression = SHORTHANDS.get(expression.strip().lower(), expression)
        minute, hour, dom, month, dow = expression.split()
        self.minutes = _field(minute, 0, 59)
        self.hours = _field(hour, 0, 23)
        self.dom_terms = [item for item in dom.split(",") if _is_term(item)]
        self.dow_terms = [item for item in dow.split(",") if _is_term(item)]
        plain_dom = ",".join(item for item in dom.split(",") if not _is_term(item))
        plain_dow = ",".join(item for item in dow.split(",") if not _is_term(item))
        self.doms = _field(plain_dom, 1, 31) if plain_dom else set()
        self.months = _field(month, 1, 12, MONTHS, 1)
        self.dows = {d % 7 for d in _field(plain_dow, 0, 6, DAYS, 0)} if plain_dow else set()
        # Vixie cron: a day field beginning with "*" makes the two day fields combine with AND.
        self.either_day = not (dom.startswith("*") or dow.startswith("*"))

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.doms or any(_day_of_month_term(t, day) for t in self.dom_terms)
        dow_ok = _weekday(day) in self.dows or any(_day_of_week_term(t, day) for t in self.dow_terms)
        return (dom_ok or dow_ok) if self.either_day else (dom_ok and dow_ok)

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        return self.day_matches(wall.date())


def oracle_fire_times(
    expression: str,
    zone: str,
    low: datetime,
    high: datetime,
    dst_repeat: str = "first",
    dst_gap: str = "skip",
    excluded: set[date] | None = None,
    calendar_zone: str | None = None,
) -> list[datetime]:
    """Every fire instant t with low < t <= high (aware UTC), by walking minutes.

    With ``excluded``, fires whose local date on ``calendar_zone`` (default:
    ``zone``) is in the set are dropped.
    """
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
    found = sorted(t for t in fires if low < t <= high)
    if excluded:
        clock = ZoneInfo(calendar_zone or zone)
        found = [t for t in found if t.astimezone(clock).date() not in excluded]
    return found


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
