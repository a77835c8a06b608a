"""Fire sources and the bounds of a spec.

A source enumerates the fire instants of a spec without its start/end bounds
(bounds are applied once, in :func:`forward_fires`, :func:`backward_fires` and
:func:`count_fires`). Instants are naive UTC.

``rate`` fires at ``anchor + k * period`` (k = 0, 1, ...) of elapsed time and
ignores daylight saving. Without an anchor it is anchored at ``start_at``,
else at 1970-01-01T00:00Z (so "15m" fires at :00, :15, :30, :45 UTC). ``once``
fires at one instant. A spec with an exclusion calendar wraps its source in
:class:`~engine.rules.timing.exclusions.ExcludingSource`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Protocol

from engine.rules.timing.cron_source import cron_source
from engine.rules.timing.durations import parse_duration
from engine.rules.timing.exclusions import ExcludingSource, exclusions_of
from engine.rules.timing.instants import CEILING, EPOCH, FLOOR, MICROSECOND, naive_utc, parse_instant
from engine.rules.timing.spec import TimeSpec
from schemas.errors import InvalidInput


class Source(Protocol):
    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        """Fire instants strictly after ``after`` in ascending order (may stop once past ``until``)."""

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        """Fire instants strictly before ``before`` in descending order (may stop once before ``since``)."""

    def count(self, low: datetime, high: datetime) -> int | None:
        """How many fire instants t satisfy low < t < high; None when that is too costly to know."""


class RateSource:
    """anchor + k * period, k >= 0: plain arithmetic, no calendar."""

    __slots__ = ("anchor", "period")

    def __init__(self, anchor: datetime, period: timedelta) -> None:
        self.anchor = anchor
        self.period = period

    def _first_index_after(self, instant: datetime) -> int:
        if instant < self.anchor:
            return 0
        return (instant - self.anchor) // self.period + 1

    def _last_index_before(self, instant: datetime) -> int:
        if instant <= self.anchor:
            return -1
        return (instant - self.anchor - MICROSECOND) // self.period

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        index = self._first_index_after(after)
        stop = min(until, CEILING) if until is not None else CEILING
        while True:
            instant = self.anchor + index * self.period
            if instant > stop:
                return
            yield instant
            index += 1

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        index = self._last_index_before(min(before, CEILING + MICROSECOND))
        while index >= 0:
            instant = self.anchor + index * self.period
            if since is not None and instant < since:
                return
            yield instant
            index -= 1

    def count(self, low: datetime, high: datetime) -> int | None:
        return max(0, self._last_index_before(high) - self._first_index_after(low) + 1)


class OnceSource:
    __slots__ = ("instant",)

    def __init__(self, instant: datetime) -> None:
        self.instant = instant

    def forward(self, after: datetime, until: datetime | None) -> Iterator[datetime]:
        if self.instant > after:
            yield self.instant

    def backward(self, before: datetime, since: datetime | None) -> Iterator[datetime]:
        if self.instant < before:
            yield self.instant

    def count(self, low: datetime, high: datetime) -> int | None:
        return int(low < self.instant < high)


@lru_cache(maxsize=16_384)
def rate_period(expression: str) -> timedelta:
    period = parse_duration(expression, "expression")
    if period <= timedelta(0):
        raise InvalidInput("expression", "a rate period must be at least 1s", "15m")
    return period


@lru_cache(maxsize=16_384)
def once_instant(expression: str) -> datetime:
    return parse_instant(expression, "expression").replace(tzinfo=None)


def source_of(spec: TimeSpec) -> Source:
    """The spec's fire instants without its bounds, minus what its exclusion calendar removes."""
    source = _unexcluded_source_of(spec)
    exclusions = exclusions_of(spec)
    return ExcludingSource(source, exclusions) if exclusions is not None else source


def _unexcluded_source_of(spec: TimeSpec) -> Source:
    if spec.kind == "cron":
        return cron_source(spec.expression, spec.time_zone, spec.dst_repeat == "both", spec.dst_gap == "shift")
    if spec.kind == "rate":
        if spec.anchor is not None:
            anchor = naive_utc(spec.anchor, "anchor")
        elif spec.start_at is not None:
            anchor = naive_utc(spec.start_at, "start_at")
        else:
            anchor = EPOCH
        return RateSource(anchor, rate_period(spec.expression))
    if spec.kind == "once":
        return OnceSource(once_instant(spec.expression))
    raise InvalidInput("kind", f"must be once, cron or rate; got {str(spec.kind)[:40]!r}", "cron")


def bounds(spec: TimeSpec) -> tuple[datetime | None, datetime | None]:
    start = naive_utc(spec.start_at, "start_at") if spec.start_at is not None else None
    end = naive_utc(spec.end_at, "end_at") if spec.end_at is not None else None
    return start, end


def forward_fires(spec: TimeSpec, after: datetime, until: datetime | None = None) -> Iterator[datetime]:
    """Bounded fire instants (naive UTC) strictly after ``after`` and not after ``until``, ascending."""
    start, end = bounds(spec)
    if start is not None and start - MICROSECOND > after:
        after = start - MICROSECOND
    if end is not None and (until is None or end < until):
        until = end
    after = max(after, FLOOR - MICROSECOND)
    if after >= CEILING or (until is not None and until <= after):
        return
    for instant in source_of(spec).forward(after, until):
        if until is not None and instant > until:
            return
        yield instant


def backward_fires(spec: TimeSpec, before: datetime, since: datetime | None = None) -> Iterator[datetime]:
    """Bounded fire instants strictly before ``before`` and not before ``since``, descending."""
    start, end = bounds(spec)
    if end is not None and end + MICROSECOND < before:
        before = end + MICROSECOND
    if start is not None and (since is None or start > since):
        since = start
    before = min(before, CEILING + MICROSECOND)
    if before <= FLOOR or (since is not None and since >= before):
        return
    for instant in source_of(spec).backward(before, since):
        if since is not None and instant < since:
            return
        yield instant


def count_fires(spec: TimeSpec, low: datetime, high: datetime) -> int | None:
    """Bounded fire instants t with low < t < high; None when unknown."""
    start, end = bounds(spec)
    if start is not None:
        low = max(low, start - MICROSECOND)
    if end is not None:
        high = min(high, end + MICROSECOND)
    if high - low <= MICROSECOND:
        return 0
    return source_of(spec).count(low, high)
