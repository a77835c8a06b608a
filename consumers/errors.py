"""What a handler can raise, and how the runtime tells a handler's failure from an outage.

* :class:`PermanentError` (or a subclass, or a type the app lists in
  ``@app.handler(target, permanent_errors=(...))``): the occurrence is never
  retried; the engine moves it to DEAD and the dead-letter list.
* :class:`OccurrenceCanceled`: the handler gave up because the runtime
  signalled that its schedule was canceled (``occurrence.cancellation``).
* Anything else a handler raises is transient: the engine retries it with
  backoff until the schedule's max attempts.
* :class:`FailedOccurrences` (batch handlers only): names which occurrences of
  the batch failed and why; each is classified as above, the others run again.

Infrastructure errors — the app's own database unreachable, the broker
unavailable — are not the occurrence's fault and do not consume an attempt:
the runtime retries the delivery in place with backoff.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import ClassVar

import asyncpg

from schemas.errors import ChronoqError


class PermanentError(ChronoqError):
    """Raise in a handler when retrying cannot help (bad payload, a rejected business rule).

    The occurrence goes to DEAD after this attempt, with this error's class
    and message in the dead-letter list.
    """

    code: ClassVar[str] = "permanent"
    transient: ClassVar[bool] = False


class OccurrenceCanceled(ChronoqError):
    """The occurrence's schedule was canceled while its handler ran (``raise_if_canceled``)."""

    code: ClassVar[str] = "canceled"


class FailedOccurrences(ChronoqError):
    """Raise in a batch handler to say which occurrences failed: ``{occurrence_id: error}``.

    The batch's transaction rolls back. Each named occurrence is reported failed with its own error
    (a :class:`PermanentError` or a type in ``permanent_errors`` makes it DEAD, anything else is retried
    by the engine); the occurrences not named run again at once, as a batch, without them.
    """

    code: ClassVar[str] = "failed_occurrences"

    def __init__(self, errors: Mapping[uuid.UUID, BaseException]) -> None:
        self.errors = dict(errors)
        super().__init__(
            f"{len(self.errors)} occurrence(s) of the batch failed: "
            + ", ".join(f"{ident}: {type(err).__name__}" for ident, err in list(self.errors.items())[:5])
        )


class InfrastructureError(ChronoqError):
    """The app's database or the broker is unavailable; the delivery is retried in place, no attempt consumed."""

    code: ClassVar[str] = "infrastructure"
    http_status: ClassVar[int] = 503
    transient: ClassVar[bool] = True


class CommitOutcomeUnknown(InfrastructureError):
    """The connection died during a delivery's COMMIT: the transaction may or may not have committed. The
    runners look the outcome up by its key (the attempt's dedupe rows) before deciding anything; left alone,
    it is an infrastructure error (retried in place, and the dedupe key keeps a repeat from applying twice)."""


#: Errors that mean "this database connection is gone", not "the handler's statement failed".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.InterfaceError,  # the connection is closed
    asyncpg.InternalClientError,  # the protocol's state, lost with the connection
    asyncpg.exceptions.OperatorInterventionError,  # class 57: terminated, shutting down
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    ConnectionError,
    OSError,
)


def lost_connection(error: BaseException, conn: asyncpg.Connection | None) -> bool:
    """True when ``error`` (or the connection's state) says the database session itself is gone."""
    if isinstance(error, (CommitOutcomeUnknown, *CONNECTION_ERRORS)):
        return True
    if conn is None:
        return False
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        # A pooled connection the server closed is taken back by its pool at once (asyncpg releases the holder
        # on close): the proxy then refuses every call, is_closed() included. It was lost.
        return True
