"""The one exception root of chronoq.

Every error chronoq raises on purpose derives from :class:`ChronoqError`, and
each class says, as class attributes, how the edges treat it:

* ``code``: the stable error code of the HTTP API and of command results
  (``{"error": {"code", "message", "field"?}}``);
* ``http_status``: the HTTP status the API answers with;
* ``transient``: whether retrying the same operation later can succeed (an
  outage), as opposed to a request or a bug that fails the same way again.

``field`` names the request field at fault, when there is one. Whether any
exception — ours or a driver's — is transient is decided in one place,
:func:`schemas.error_classification.is_transient`. Messages are written for a
person: what was wrong and what to do about it.
"""

from __future__ import annotations

from typing import ClassVar


class ChronoqError(Exception):
    """Root of every chronoq error."""

    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = 400
    transient: ClassVar[bool] = False
    field: str | None = None


class InvalidInput(ChronoqError):
    """A request or schedule field is invalid; nothing was written.

    ``field`` names the offending field as the user wrote it (``expression``,
    ``time_zone``, ``payload``...), ``problem`` says what is wrong and
    ``example`` shows a valid value when one helps.
    """

    code = "invalid_input"
    http_status = 422

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

    code = "not_found"
    http_status = 404

    def __init__(self, kind: str, ident: object) -> None:
        self.kind = kind
        self.ident = ident
        super().__init__(f"{kind} {ident} not found")


class Forbidden(ChronoqError):
    """The tenant may not use this (a target that belongs to another tenant); nothing was written.

    ``field`` names the request field (``target``); the message says how to obtain the right. Unlike
    another tenant's schedule (a 404: its existence must not leak), a taken target name is a unique
    name like any other: refusing it reveals only that it is taken.
    """

    code = "forbidden"
    http_status = 403

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class MalformedMessage(ChronoqError):
    """A Kafka record that is not a valid chronoq record of its topic (a poison record).

    Decoders raise nothing else, whatever the bytes and headers (``schemas/record_fields.py``):
    ``field`` names the part at fault (``value``, ``headers``, a header, a field of the JSON
    object) so the rejection says what to fix.
    """

    code = "malformed"

    def __init__(self, problem: str, field: str | None = None) -> None:
        self.problem = problem
        self.field = field
        super().__init__(problem)


class Conflict(ChronoqError):
    """The request conflicts with stored state (idempotency key reuse, stale version)."""

    code = "conflict"
    http_status = 409


class QuotaExceeded(ChronoqError):
    """A tenant quota would be exceeded; raise the quota or remove schedules. ``field`` is the quota."""

    code = "quota_exceeded"
    http_status = 429

    def __init__(self, quota: str, limit: object, requested: object) -> None:
        self.quota = quota
        self.field = quota
        self.limit = limit
        self.requested = requested
        super().__init__(
            f"quota {quota} exceeded: limit {limit}, this request needs {requested};"
            " ask an operator to raise the tenant's quota or remove schedules"
        )


class StackError(ChronoqError):
    """The embedded PostgreSQL/Kafka stack could not be started or found (an operator must act)."""

    code = "stack_unavailable"
    http_status = 503
