"""The app's handlers: one per target, and optionally a fallback for every other target."""

from __future__ import annotations

from collections.abc import Callable

from consumers.attempt_runner import BatchHandler, Handler, HandlerRegistration
from schemas.topics import occurrence_topic, validate_target


class HandlerRegistry:
    """Handlers by target with their limits (timeout, concurrency, permanent errors, batch size)."""

    def __init__(
        self,
        default_timeout: float,
        default_concurrency: int,
        idle_timeout_for: Callable[[float], float] | None = None,
    ) -> None:
        self.default_timeout = default_timeout
        self.default_concurrency = default_concurrency
        # A target's idle-in-transaction limit from its timeout (ConsumerConfig.idle_timeout_for); None: the
        # runner's app-wide limit.
        self.idle_timeout_for = idle_timeout_for
        self._by_target: dict[str, HandlerRegistration] = {}
        self.fallback: HandlerRegistration | None = None

    def limits(
        self,
        timeout: float | None,
        concurrency: int | None,
        permanent_errors: tuple[type[BaseException], ...],
        batch: int | None = None,
    ) -> Callable[[Handler | BatchHandler], HandlerRegistration]:
        """Validate a handler's limits now (before the handler exists); return what registers it."""
        timeout = self.default_timeout if timeout is None else timeout
        concurrency = self.default_concurrency if concurrency is None else concurrency
        if timeout <= 0 or concurrency < 1:
            raise ValueError("a handler needs a positive timeout and a concurrency of at least 1")
        idle = self.idle_timeout_for(timeout) if self.idle_timeout_for is not None else None
        return lambda fn: HandlerRegistration(fn, timeout, concurrency, tuple(permanent_errors), batch, idle)

    def add(self, target: str, registration: HandlerRegistration) -> None:
        validate_target(target)
        if target in self._by_target:
            raise ValueError(f"target {target!r} already has a handler")
        self._by_target[target] = registration

    def for_target(self, target: str) -> HandlerRegistration | None:
        """The target's own handler, else the fallback, else None."""
        return self._by_target.get(target, self.fallback)

    @property
    def topics(self) -> list[str]:
        """The occurrence topics of the targets with a handler of their own."""
        return sorted(occurrence_topic(target) for target in self._by_target)

    def __bool__(self) -> bool:
        return bool(self._by_target) or self.fallback is not None
