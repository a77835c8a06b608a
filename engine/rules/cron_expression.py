"""Parsing of five-field cron expressions, with the calendar terms L, W and #.

This module only turns text into sets of field values and answers "which days
of this month match?". When a matching day and wall-clock time become an
instant (daylight saving, zones) is decided in :mod:`engine.rules.timing`.

Accepted, as in Vixie cron: ``minute hour day-of-month month day-of-week``;
``*``, values, ``a-b`` ranges, ``/step`` on ``*`` or a range, comma lists,
month names ``JAN``-``DEC`` and day names ``SUN``-``SAT`` (any case), ``0`` and
``7`` both Sunday, and the aliases ``@yearly @annually @monthly @weekly
@daily @midnight @hourly``. ``N/step`` is read as ``N-<field maximum>/step``
(croniter and most crons do the same).

Always accepted as well, in the day fields only: the calendar terms ``L``,
``L-n``, ``nW``, ``LW`` (day-of-month) and ``dL``, ``d#k`` (day-of-week),
alone or in comma lists with plain values; their days are computed in
:mod:`engine.rules.cron_day_terms`. They were rejected before, so no
expression that was valid changes meaning. A day field with a term needs the
other day field to start with ``*`` (the AND rule); ``0 9 L * FRI`` is
rejected as ambiguous.

Rejected with a message naming the problem: six or seven fields (seconds or
years), ``@reboot``, Jenkins ``H``, Quartz ``?``, L/W/# outside the day
fields, ``CRON_TZ=``/``TZ=`` prefixes, wrapping ranges such as ``22-2``,
steps of 0 or larger than the field, out-of-range values, expressions over
:data:`MAX_EXPRESSION_LENGTH` characters, and expressions whose days can
never occur (``0 0 30 2 *``, ``0 9 31W 2 *``).

We parse ourselves instead of delegating to croniter because croniter accepts
all of the extensions above, silently wraps reversed ranges, and (7.0.0) reads
a one-value range ``5-5`` as ``*``, and its L/W/# semantics differ from
Quartz's in details; a test cross-checks our field expansion against
``croniter.expand`` for plain fields.
"""

from __future__ import annotations

import calendar
import re
from functools import lru_cache

from engine.rules.cron_day_terms import (
    DayTerm,
    is_day_term,
    parse_day_of_month_term,
    parse_day_of_week_term,
)
from schemas.errors import InvalidInput

MAX_EXPRESSION_LENGTH = 200
"""Longer expressions are rejected before parsing: nobody needs one, and a
56,000-character expression takes croniter a quarter of a second."""

ALIASES: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIELD = "expression"
_EXAMPLE = "*/15 9-17 * * MON-FRI"
# Spelled out rather than taken from calendar.month_abbr, which follows the process locale.
_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), start=1
    )
}
_DAY_NAMES = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
# Days a month can have at most; February counts 29 because "29 2" fires in leap years.
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_ITEM = re.compile(r"^(?:(?P<star>\*)|(?P<lo>[0-9A-Za-z]+)(?:-(?P<hi>[0-9A-Za-z]+))?)(?:/(?P<step>[0-9]+))?$")


class _FieldSpec:
    __slots__ = ("name", "low", "high", "star_high", "names", "example")

    def __init__(
        self, name: str, low: int, high: int, star_high: int, names: dict[str, int] | None, example: str
    ) -> None:
        self.name = name
        self.low = low
        self.high = high  # largest value a user may write (7 for day-of-week)
        self.star_high = star_high  # largest value "*" and "N/step" cover (6 for day-of-week)
        self.names = names
        self.example = example


_FIELDS = (
    _FieldSpec("minute", 0, 59, 59, None, "*/15 * * * *"),
    _FieldSpec("hour", 0, 23, 23, None, "0 9-17 * * *"),
    _FieldSpec("day-of-month", 1, 31, 31, None, "0 0 1,15 * *"),
    _FieldSpec("month", 1, 12, 12, _MONTH_NAMES, "0 0 1 JAN,JUL *"),
    _FieldSpec("day-of-week", 0, 7, 6, _DAY_NAMES, "0 9 * * MON-FRI"),
)


class CronExpression:
    """A parsed five-field cron expression (immutable after construction).

    ``day_or`` is Vixie cron's rule: when neither day field starts with ``*``
    a day matches if day-of-month OR day-of-week matches; otherwise both must.
    ``dom_terms``/``dow_terms`` are the calendar terms of the day fields; a
    field's plain values and its terms are a union.
    """

    __slots__ = (
        "text",
        "minutes",
        "hours",
        "days_of_month",
        "months",
        "days_of_week",
        "day_or",
        "times",
        "_month_days",
        "dom_terms",
        "dow_terms",
        "fields",
        "_plain_text",
    )

    def __init__(
        self,
        text: str,
        minutes: tuple[int, ...],
        hours: tuple[int, ...],
        days_of_month: frozenset[int],
        months: frozenset[int],
        days_of_week: frozenset[int],
        day_or: bool,
        dom_terms: tuple[DayTerm, ...] = (),
        dow_terms: tuple[DayTerm, ...] = (),
        fields: tuple[str, ...] = ("*", "*", "*", "*", "*"),
        plain_text: tuple[str, str] | None = None,
    ) -> None:
        self.text = text
        self.minutes = minutes
        self.hours = hours
        self.days_of_month = days_of_month
        self.months = months
        self.days_of_week = days_of_week  # 0 = Sunday ... 6 = Saturday
        self.day_or = day_or
        self.dom_terms = dom_terms
        self.dow_terms = dow_terms
        self.fields = fields
        # The plain (non-term) items of the two day fields, for describing why a day matched.
        self._plain_text = plain_text if plain_text is not None else (fields[2], fields[4])
        # Matching wall-clock times of a day as minutes since midnight, ascending.
        self.times: tuple[int, ...] = tuple(h * 60 + m for h in hours for m in minutes)
        self._month_days: dict[tuple[int, int], tuple[int, ...]] = {}

    def month_days(self, year: int, month: int) -> tuple[int, ...]:
        """The matching days of one month, ascending (memoized: this is the hot path)."""
        key = (year, month)
        found = self._month_days.get(key)
        if found is not None:
            return found
        if month not in self.months:
            found = ()
        else:
            first_weekday, length = calendar.monthrange(year, month)  # Monday = 0
            sunday_based = (first_weekday + 1) % 7
            if self.dom_terms or self.dow_terms:
                found = self.days_of_shape(sunday_based, length)
            else:
                doms, dows, day_or = self.days_of_month, self.days_of_week, self.day_or
                days = []
                for day in range(1, length + 1):
                    dom = day in doms
                    dow = (sunday_based + day - 1) % 7 in dows
                    if (dom or dow) if day_or else (dom and dow):
                        days.append(day)
                found = tuple(days)
        if len(self._month_days) > 20_000:  # bounded: a scan over centuries must not grow it forever
            self._month_days.clear()
        self._month_days[key] = found
        return found

    def days_of_shape(self, first_weekday: int, length: int) -> tuple[int, ...]:
        """The matching days of a month with ``length`` days whose 1st is ``first_weekday`` (0 = Sunday).

        A selected month's days depend on nothing else, which makes "can this
        ever fire?" a finite question.
        """
        dom_days = {day for day in self.days_of_month if day <= length}
        for term in self.dom_terms:
            day = term.day_in(first_weekday, length)
            if day is not None:
                dom_days.add(day)
        dows = self.days_of_week
        dow_days = {day for day in range(1, length + 1) if (first_weekday + day - 1) % 7 in dows}
        for term in self.dow_terms:
            day = term.day_in(first_weekday, length)
            if day is not None:
                dow_days.add(day)
        return tuple(sorted(dom_days | dow_days if self.day_or else dom_days & dow_days))

    def describe_day(self, year: int, month: int, day: int) -> str:
        """Which rule of the day fields selects this (matching) day, for previews.

        ``every day``; ``day-of-week MON-FRI``; ``day-of-month L: last day of the
        month``; under the OR rule only the field(s) that matched.
        """
        first_weekday, length = calendar.monthrange(year, month)
        first_weekday = (first_weekday + 1) % 7
        dom_field, dow_field = self.fields[2], self.fields[4]
        plain_dom, plain_dow = self._plain_text

        def dom_reason() -> str | None:
            if day in self.days_of_month:
                return f"day-of-month {plain_dom}"
            for term in self.dom_terms:
                if term.day_in(first_weekday, length) == day:
                    return f"day-of-month {term.describe(first_weekday, length, day)}"
            return None

        def dow_reason() -> str | None:
            if (first_weekday + day - 1) % 7 in self.days_of_week:
                return f"day-of-week {plain_dow}"
            for term in self.dow_terms:
                if term.day_in(first_weekday, length) == day:
                    return f"day-of-week {term.describe(first_weekday, length, day)}"
            return None

        if self.day_or:
            reasons = [reason for reason in (dom_reason(), dow_reason()) if reason]
        else:
            reasons = []
            if dom_field != "*":
                reasons.append(dom_reason() or f"day-of-month {dom_field}")
            if dow_field != "*":
                reasons.append(dow_reason() or f"day-of-week {dow_field}")
        return " and ".join(reasons) or "every day"

    def __repr__(self) -> str:
        return f"CronExpression({self.text!r})"


def normalize_cron(text: str) -> str:
    """Strip and collapse whitespace; lower-case an ``@alias``. Validation is :func:`parse_cron`'s."""
    text = " ".join(text.split())
    if text.startswith("@"):
        return text.lower()
    return text


@lru_cache(maxsize=16_384)
def parse_cron(text: str) -> CronExpression:
    """Parse ``text`` or raise :class:`InvalidInput` for field ``expression``.

    Memoized per text: thousands of schedules share a handful of expressions.
    """
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise InvalidInput(_FIELD, f"is {len(text)} characters long; the limit is {MAX_EXPRESSION_LENGTH}", _EXAMPLE)
    text = normalize_cron(text)
    if not text:
        raise InvalidInput(_FIELD, "is empty; a cron expression has five fields", _EXAMPLE)
    upper = text.upper()
    if upper.startswith(("CRON_TZ=", "TZ=")):
        raise InvalidInput(
            _FIELD,
            "must not carry a zone prefix (CRON_TZ=/TZ=); put the zone in time_zone",
            "expression '0 9 * * *' with time_zone 'Europe/Berlin'",
        )
    if text.startswith("@"):
        if text == "@reboot":
            raise InvalidInput(_FIELD, "@reboot is not a time; chronoq schedules fire at times only", "@daily")
        if text not in ALIASES:
            raise InvalidInput(_FIELD, f"unknown alias {text[:20]!r}; known aliases: {', '.join(ALIASES)}", "@hourly")
        fields = ALIASES[text].split(" ")
    else:
        fields = text.split(" ")
    if len(fields) != 5:
        if len(fields) in (6, 7):
            problem = (
                f"has {len(fields)} fields; chronoq takes the standard five (minute hour day-of-month"
                " month day-of-week) without seconds or years; for sub-minute periods use kind"
                " 'rate' (e.g. '30s')"
            )
        else:
            problem = (
                f"has {len(fields)} fields; a cron expression has five: minute hour day-of-month month day-of-week"
            )
        raise InvalidInput(_FIELD, problem, _EXAMPLE)
    expression = _compile(text, fields)
    dom_terms, dow_terms, day_or = expression.dom_terms, expression.dow_terms, expression.day_or
    months, doms = expression.months, expression.days_of_month
    if dom_terms or dow_terms:
        _check_terms(expression, text)
        return expression
    if not day_or and not any(d <= _MAX_DAYS[m] for m in months for d in doms):
        # Under the AND rule the day-of-month must exist in one of the months. Every
        # existing (month, day) falls on every weekday in some year, so the weekday
        # field cannot make a valid date impossible; under the OR rule the weekday
        # alone makes it fire.
        raise InvalidInput(
            _FIELD, f"{text!r} can never fire: no selected month has the selected day of month", "0 0 28 2 *"
        )
    return expression


def _compile(text: str, fields: list[str]) -> CronExpression:
    """The five fields as value sets and calendar terms (each field checked, naming what is wrong)."""
    for spec, raw in zip(_FIELDS, fields, strict=True):
        _reject_extensions(spec, raw)
    plain = list(fields)
    terms: list[tuple[DayTerm, ...]] = [(), ()]
    for slot, index in enumerate((2, 4)):
        plain[index], terms[slot] = _split_day_field(_FIELDS[index], fields[index])
    # A day field of terms only ("L") has no plain values.
    values = [
        _parse_field(spec, raw) if raw or spec not in (_FIELDS[2], _FIELDS[4]) else set()
        for spec, raw in zip(_FIELDS, plain, strict=True)
    ]
    minutes, hours, doms, months, dows = values
    return CronExpression(
        text,
        tuple(sorted(minutes)),
        tuple(sorted(hours)),
        frozenset(doms),
        frozenset(months),
        frozenset({0 if d == 7 else d for d in dows}),
        not (fields[2].startswith("*") or fields[4].startswith("*")),
        terms[0],
        terms[1],
        tuple(fields),
        (plain[2], plain[4]),
    )


def _reject_extensions(spec: _FieldSpec, raw: str) -> None:
    """Name the non-standard syntax people paste from Jenkins and Quartz instead of a generic error."""
    upper = raw.upper()
    if spec.names is not None:  # letters inside JUL, WED, SAT... are fine
        for name in spec.names:
            upper = upper.replace(name, "")
    if "H" in upper:
        raise InvalidInput(
            _FIELD,
            f"Jenkins-style 'H' (hashed) values in the {spec.name} field are not supported; write explicit values",
            "7 * * * *",
        )
    if "?" in upper:
        raise InvalidInput(
            _FIELD,
            f"Quartz-style '?' (no specific value) in the {spec.name} field is not supported; write * there",
            "0 9 * * MON",
        )
    if spec.name not in ("day-of-month", "day-of-week"):
        for symbol, what in (("#", "'#' (nth weekday)"), ("L", "'L' (last)"), ("W", "'W' (nearest weekday)")):
            if symbol in upper:
                raise InvalidInput(
                    _FIELD,
                    f"{what} in the {spec.name} field: L, W and # are allowed only in the"
                    " day-of-month and day-of-week fields",
                    "0 9 L * *",
                )


def _split_day_field(spec: _FieldSpec, raw: str) -> tuple[str, tuple[DayTerm, ...]]:
    """A day field's plain items (as text, for the standard parser) and its calendar terms."""
    if not any(is_day_term(item) for item in raw.split(",")):
        return raw, ()
    parse = parse_day_of_month_term if spec.name == "day-of-month" else parse_day_of_week_term
    plain: list[str] = []
    terms: list[DayTerm] = []
    for item in raw.split(","):
        if is_day_term(item):
            terms.append(parse(item))
        else:
            plain.append(item)
    if any(item == "" for item in plain):
        raise InvalidInput(_FIELD, f"the {spec.name} field {raw[:30]!r} has an empty item", spec.example)
    return ",".join(plain), tuple(terms)


# Every (length, weekday of the 1st) a month can have; all of them occur in the Gregorian calendar.
_SHAPES = {
    month: tuple((length, first) for length in ((28, 29) if month == 2 else (_MAX_DAYS[month],)) for first in range(7))
    for month in range(1, 13)
}


def _check_terms(expression: CronExpression, text: str) -> None:
    """A day field with a term needs the AND rule, and some selected month must have a matching day."""
    dom_field, dow_field = expression.fields[2], expression.fields[4]
    if expression.dom_terms and not dow_field.startswith("*"):
        raise InvalidInput(
            _FIELD,
            f"{text!r} is ambiguous: day-of-month {dom_field} with day-of-week {dow_field}"
            " (Vixie cron would fire on either, Quartz and EventBridge reject it); put * in one"
            " of the day fields, or use two schedules",
            "0 9 L * *",
        )
    if expression.dow_terms and not dom_field.startswith("*"):
        raise InvalidInput(
            _FIELD,
            f"{text!r} is ambiguous: day-of-week {dow_field} with day-of-month {dom_field}"
            " (Vixie cron would fire on either, Quartz and EventBridge reject it); put * in one"
            " of the day fields, or use two schedules",
            "0 9 * * TUE#2",
        )
    for month in expression.months:
        for length, first in _SHAPES[month]:
            if expression.days_of_shape(first, length):
                return
    raise InvalidInput(
        _FIELD,
        f"{text!r} can never fire: in no selected month does any day match day-of-month"
        f" {dom_field} and day-of-week {dow_field}",
        "0 9 L * *",
    )


def _value(spec: _FieldSpec, token: str) -> int:
    if token.isdigit():
        number = int(token)
    elif spec.names is not None and token.upper() in spec.names:
        return spec.names[token.upper()]
    else:
        allowed = (
            " or a name like JAN"
            if spec.names is _MONTH_NAMES
            else (" or a name like MON" if spec.names is not None else "")
        )
        raise InvalidInput(
            _FIELD,
            f"{token[:20]!r} is not a valid {spec.name} value: use a number {spec.low}-{spec.high}{allowed}",
            spec.example,
        )
    if not spec.low <= number <= spec.high:
        raise InvalidInput(_FIELD, f"{spec.name} value {number} is out of range {spec.low}-{spec.high}", spec.example)
    return number


def _parse_field(spec: _FieldSpec, raw: str) -> set[int]:
    if raw == "":
        raise InvalidInput(_FIELD, f"the {spec.name} field is empty", spec.example)
    result: set[int] = set()
    for item in raw.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise InvalidInput(
                _FIELD,
                f"{item[:20]!r} is not valid in the {spec.name} field; use *, a value,"
                " a range a-b, a step */n or a-b/n, or a comma list",
                spec.example,
            )
        step_text = match.group("step")
        step = 1
        if step_text is not None:
            step = int(step_text)
            span = spec.star_high - spec.low
            if not 1 <= step <= span:
                raise InvalidInput(
                    _FIELD,
                    f"step {step} in the {spec.name} field must be between 1 and {span}"
                    + ("; for intervals that do not divide the hour/day use kind 'rate'" if step > span else ""),
                    spec.example,
                )
        if match.group("star"):
            low, high = spec.low, spec.star_high
        else:
            low = _value(spec, match.group("lo"))
            if match.group("hi") is not None:
                high = _value(spec, match.group("hi"))
                if high < low:
                    raise InvalidInput(
                        _FIELD,
                        f"range {item[:20]!r} in the {spec.name} field runs backwards;"
                        " ranges do not wrap around, split it into two ranges",
                        "0 22-23,0-2 * * *",
                    )
            elif step_text is not None:
                high = spec.star_high  # "N/step" = "N-max/step"
            else:
                high = low
        result.update(range(low, high + 1, step))
    return result
