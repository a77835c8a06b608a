"""Start-up steps of long-running processes that wait for their dependencies instead of exiting.

A process restarted into a database or broker that is not accepting connections yet (still starting,
restarting, full) retries the step with capped backoff and logs each retry; anything not transient (a
wrong password, a refused certificate, no such database) is raised at once, because waiting cannot fix
it. Kubernetes, systemd and compose start things in any order: an engine must not crash-loop until
Kafka is up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from schemas.capped_backoff import capped_doubling
from schemas.clock import pause
from schemas.error_classification import is_transient

T = TypeVar("T")


async def retry_until_ready(
    attempt: Callable[[], Awaitable[T]],
    stop: asyncio.Event,
    log: logging.Logger,
    *,
    step: str,
    action: str,
    backoff: float = 0.2,
    backoff_max: float = 5.0,
) -> T | None:
    """``await attempt()`` until it succeeds and return its result, retrying transient failures (see
    ``schemas.error_classification``) after ``backoff`` seconds, doubled up to ``backoff_max``, each logged
    as a warning with ``action``. None when ``stop`` is set first; a failure that is not transient is raised.
    ``attempt`` must build what it starts afresh: a client whose start failed is closed, not restartable."""
    delays = capped_doubling(backoff, backoff_max)
    while True:
        try:
            return await attempt()
        except Exception as err:
            if not is_transient(err):
                raise
            delay = next(delays)
            log.warning(
                "could not %s yet; retrying",
                step,
                extra={"action": action, "step": step, "error": repr(err), "backoff": delay},
            )
        await pause(stop, delay)
        if stop.is_set():
            return None
