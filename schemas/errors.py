"""The one exception root of chronoq.

Every error chronoq raises on purpose derives from :class:`ChronoqError`.
Retry loops read the class-level ``retriable`` flag instead of listing types.
Messages are written for a person: what was wrong and what to do about it.
"""

from __future__ import annotations

from typing import ClassVar


class ChronoqError(Exception):
    """Root of every chronoq error."""

    retriable: ClassVar[bool] = False


class InvalidInput(ChronoqError):
    """A request or schedule field is invalid; nothing was written.

    ``field`` names the offending field as the user wrote it (``expression``,
    ``time_zone``, ``payload``...), ``problem`` says what is wrong and
    ``example`` shows a valid value when one helps.
    """

    def __init__(self, field: str, problem: str, example: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.example = example
        text = f"{field}: {problem}"
        if example:
            text += f" (example of a valid value: {example})"
        super().__init__(text)


class NotFound(ChronoqError):
    """The object does not exist for this tenant (or at all: we never say which)."""

    def __init__(self, kind: str, ident: object) -> None:
        self.kind = kind
        self.ident = ident
        super().__init__(f"{kind} {ident} not found")


class Conflict(ChronoqError):
    """The request conflicts with stored state (idempotency key reuse, stale version)."""


class QuotaExceeded(ChronoqError):
    """A tenant quota would be exceeded; raise the quota or remove schedules."""

    def __init__(self, quota: str, limit: object, requested: object) -> None:
        self.quota = quota
        self.limit = limit
        self.requested = requested
        super().__init__(
            f"quota {quota} exceeded: limit {limit}, this request needs {requested};"
            " ask an operator to raise the tenant's quota or remove schedules"
        )


class StackError(ChronoqError):
    """The embedded PostgreSQL/Kafka stack could not be started or found."""


class TransientInfrastructureError(ChronoqError):
    """Database or broker unavailable; the operation is safe to retry."""

    retriable = True
