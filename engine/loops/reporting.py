"""How every loop reports: one way to log a failed pass, and the periodic one-line summary.

A failure is a warning when it is transient
(:func:`schemas.error_classification.is_transient`: the database or broker is
away, and the loop simply tries again) and an error with its traceback
otherwise (a bug or a request that fails the same way again).

The summary is one INFO line every ``every`` seconds with what happened since
the previous line, then the component's gauges, then the error count::

    relay: passes=120 published=3000 failed=0 fenced=0 backlog=12 errors=0
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

from schemas.error_classification import is_transient

#: Seconds between summary lines unless a component says otherwise.
SUMMARY_EVERY = 30.0

Gauges = Callable[[], Awaitable[Mapping[str, int]]]


def log_failure(log: logging.Logger, name: str, err: BaseException, retry_in: float) -> None:
    """Log a failed pass of loop ``name`` that will be retried in ``retry_in`` seconds."""
    transient = is_transient(err)
    extra = {"action": f"{name}.error", "error": repr(err), "transient": transient, "retry_in_s": retry_in}
    if transient:
        log.warning("%s pass failed (transient); retrying", name, extra=extra)
    else:
        log.error("%s pass failed; retrying", name, extra=extra, exc_info=err)


class LoopSummary:
    """Counts since the last summary line, and the line itself when it is due.

    ``gauges`` (optional) is read when a line is due; it may also record the
    component's OpenTelemetry gauges, which are then measured on the same
    schedule. ``monotonic`` is injectable so tests need no wall-clock waits.
    """

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        every: float = SUMMARY_EVERY,
        gauges: Gauges | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.log = log
        self.every = every
        self.gauges = gauges
        self.monotonic = monotonic
        self.counts: Counter[str] = Counter()
        self._due = monotonic() + every

    def add(self, counts: Mapping[str, int]) -> None:
        self.counts.update(counts)

    async def maybe_log(self) -> str | None:
        """Log the line if it is due; return it (None when not due or switched off with ``every=0``)."""
        if self.every <= 0 or self.monotonic() < self._due:
            return None
        self._due = self.monotonic() + self.every
        values: dict[str, int] = dict(self.counts)
        self.counts.clear()
        if self.gauges is not None:
            try:
                values.update(await self.gauges())
            except Exception as err:  # noqa: BLE001 - an unreadable gauge must not end the loop
                log_failure(self.log, f"{self.name}.gauges", err, self.every)
        line = summary_line(self.name, values)
        self.log.info(line, extra={"action": f"{self.name}.summary"})
        return line


def summary_line(name: str, values: Mapping[str, int]) -> str:
    """``name: key=value ...``: passes (or records) first, errors last (0 when none), the rest as given."""
    first = [key for key in ("passes", "records") if key in values]
    middle = [key for key in values if key not in (*first, "errors")]
    return f"{name}: " + " ".join(f"{key}={values.get(key, 0)}" for key in [*first, *middle, "errors"])
