"""Cron day terms whose days depend on the month: ``L``, ``L-n``, ``nW``, ``LW``, ``nL``, ``n#k``.

The semantics (docs/time-contract.md, "Calendar terms"), all within one month,
weekdays numbered as in the rest of the day-of-week field (0 and 7 Sunday,
names SUN-SAT):

* day-of-month ``L``: the last day of the month (31 January, 28 or 29 February).
* day-of-month ``L-n`` (n 0-30): n days before the last day (Quartz's reading):
  ``L-1`` is 30 January, ``L-3`` 28 January. A month with fewer than n + 1 days
  has no such day and does not fire.
* day-of-month ``nW`` (n 1-31): the weekday (Monday-Friday) nearest to day n,
  never leaving the month: a Saturday moves to the Friday before, or to
  Monday the 3rd when n is 1; a Sunday moves to the Monday after, or to the
  Friday two days before when n is the month's last day. A month without day
  n (``31W`` in April) does not fire.
* day-of-month ``LW``: the last weekday of the month.
* day-of-week ``dL`` (``5L``, ``FRIL``): the last such weekday of the month.
  Bare ``L`` in day-of-week is rejected: Quartz reads it as Saturday, others
  as "last day of the week".
* day-of-week ``d#k`` (``2#3``, ``TUE#2``; k 1-5): the k-th such weekday of the
  month; months without a fifth one do not fire for ``#5``.

Numeric weekdays are Vixie's (``5L`` is the last Friday); Quartz numbers
Sunday 1, so a pasted Quartz ``6L`` means something else here: names are safe.

A term's days depend only on the month's length and the weekday of its first
day, so "can this expression ever fire?" is answered exactly by trying the
at most 12 x 2 x 7 (month, length, first weekday) combinations, all of which
occur in the Gregorian calendar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.errors import InvalidInput

_FIELD = "expression"
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_DAY_WORDS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_ORDINALS = ("", "first", "second", "third", "fourth", "fifth")

_LAST_MINUS = re.compile(r"^L(?:-(?P<offset>[0-9]{1,2}))?$")
_NEAREST = re.compile(r"^(?P<day>[0-9]{1,2})W$")
_WEEKDAY = r"(?P<weekday>[0-7]|SUN|MON|TUE|WED|THU|FRI|SAT)"
_LAST_WEEKDAY = re.compile(rf"^{_WEEKDAY}L$")
_NTH_WEEKDAY = re.compile(rf"^{_WEEKDAY}#(?P<nth>[0-9]{{1,2}})$")


@dataclass(frozen=True, slots=True)
class DayTerm:
    """One month-dependent day term of a day field, as written (upper case) and as a rule.

    ``rule`` is one of ``last`` (``offset`` days before the last day),
    ``nearest_weekday`` (to ``day``), ``last_weekday_of_month``,
    ``last_of_weekday`` (``weekday``) and ``nth_weekday`` (``nth`` ``weekday``).
    """

    text: str
    rule: str
    day: int = 0
    offset: int = 0
    weekday: int = 0  # 0 = Sunday ... 6 = Saturday
    nth: int = 0

    def day_in(self, first_weekday: int, length: int) -> int | None:
        """The day of a month with ``length`` days whose 1st is ``first_weekday`` (0 = Sunday), or None."""
        rule = self.rule
        if rule == "last":
            day = length - self.offset
            return day if day >= 1 else None
        if rule == "nearest_weekday":
            if self.day > length:
                return None
            return _nearest_weekday(self.day, first_weekday, length)
        if rule == "last_weekday_of_month":
            return _nearest_weekday(length, first_weekday, length)
        if rule == "last_of_weekday":
            last_weekday = (first_weekday + length - 1) % 7
            return length - (last_weekday - self.weekday) % 7
        # nth_weekday
        first = 1 + (self.weekday - first_weekday) % 7
        day = first + 7 * (self.nth - 1)
        return day if day <= length else None

    def describe(self, first_weekday: int, length: int, day: int) -> str:
        """Why this term chose ``day`` in such a month, for previews."""
        rule = self.rule
        if rule == "last":
            return (
                f"{self.text}: last day of the month"
                if self.offset == 0
                else f"{self.text}: {self.offset} day{'s' if self.offset > 1 else ''} before the last day"
            )
        if rule in ("nearest_weekday", "last_weekday_of_month"):
            wanted = self.day if rule == "nearest_weekday" else length
            what = "last day" if rule == "last_weekday_of_month" else f"day {wanted}"
            if day == wanted:
                return f"{self.text}: weekday nearest to {what} (itself a weekday)"
            wanted_name = _DAY_WORDS[(first_weekday + wanted - 1) % 7]
            day_name = _DAY_WORDS[(first_weekday + day - 1) % 7]
            return f"{self.text}: weekday nearest to {what} ({wanted_name} {wanted} -> {day_name} {day})"
        if rule == "last_of_weekday":
            return f"{self.text}: last {_DAY_WORDS[self.weekday]} of the month"
        return f"{self.text}: {_ORDINALS[self.nth]} {_DAY_WORDS[self.weekday]} of the month"


def _nearest_weekday(day: int, first_weekday: int, length: int) -> int:
    weekday = (first_weekday + day - 1) % 7
    if weekday == 6:  # Saturday: the Friday before, unless that leaves the month
        return day - 1 if day > 1 else day + 2
    if weekday == 0:  # Sunday: the Monday after, unless that leaves the month
        return day + 1 if day < length else day - 2
    return day


def is_day_term(item: str) -> bool:
    """Whether a comma-list item of a day field uses L, W or # (upper-cased names allowed)."""
    upper = item.upper()
    for name in _DAY_NAMES:
        upper = upper.replace(name, "")
    return any(symbol in upper for symbol in ("L", "W", "#"))


def parse_day_of_month_term(item: str) -> DayTerm:
    """Parse ``L``, ``L-n``, ``nW`` or ``LW``, or raise InvalidInput saying what is allowed."""
    text = item.upper()
    if text == "LW":
        return DayTerm(text, "last_weekday_of_month")
    match = _LAST_MINUS.match(text)
    if match is not None:
        offset = int(match.group("offset") or 0)
        if offset > 30:
            raise InvalidInput(
                _FIELD, f"{item!r}: the offset of L-n in the day-of-month field must be 0-30", "0 9 L-2 * *"
            )
        return DayTerm(text, "last", offset=offset)
    match = _NEAREST.match(text)
    if match is not None:
        day = int(match.group("day"))
        if not 1 <= day <= 31:
            raise InvalidInput(_FIELD, f"{item!r}: nW in the day-of-month field needs a day 1-31", "0 9 15W * *")
        return DayTerm(text, "nearest_weekday", day=day)
    if "#" in text:
        raise InvalidInput(
            _FIELD, f"{item[:20]!r}: '#' (nth weekday) belongs in the day-of-week field", "0 9 * * TUE#2"
        )
    raise InvalidInput(
        _FIELD,
        f"{item[:20]!r} is not valid in the day-of-month field; L and W are written L,"
        " L-n (n days before the last day), nW (weekday nearest to day n) or LW (last weekday),"
        " without ranges or steps",
        "0 9 L * *",
    )


def parse_day_of_week_term(item: str) -> DayTerm:
    """Parse ``dL`` or ``d#k`` (d a number 0-7 or SUN-SAT), or raise InvalidInput saying what is allowed."""
    text = item.upper()
    if text == "L":
        raise InvalidInput(
            _FIELD,
            "bare 'L' in the day-of-week field is ambiguous (Quartz reads it as Saturday);"
            " write SAT, or dL for the last such weekday of the month",
            "0 9 * * FRIL",
        )
    match = _LAST_WEEKDAY.match(text)
    if match is not None:
        return DayTerm(text, "last_of_weekday", weekday=_weekday(match.group("weekday")))
    match = _NTH_WEEKDAY.match(text)
    if match is not None:
        nth = int(match.group("nth"))
        if not 1 <= nth <= 5:
            raise InvalidInput(
                _FIELD, f"{item!r}: the k of d#k must be 1-5 (no month has a sixth weekday of a kind)", "0 9 * * TUE#2"
            )
        return DayTerm(text, "nth_weekday", weekday=_weekday(match.group("weekday")), nth=nth)
    if "W" in text:
        raise InvalidInput(
            _FIELD, f"{item[:20]!r}: 'W' (nearest weekday) belongs in the day-of-month field", "0 9 15W * *"
        )
    raise InvalidInput(
        _FIELD,
        f"{item[:20]!r} is not valid in the day-of-week field; L and # are written dL"
        " (last such weekday of the month) or d#k (k-th such weekday, k 1-5), with d 0-7 or"
        " SUN-SAT, without ranges or steps",
        "0 9 * * FRIL",
    )


def _weekday(text: str) -> int:
    if text.isdigit():
        return int(text) % 7
    return _DAY_NAMES.index(text)
