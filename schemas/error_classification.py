"""One answer to "is this error transient?", for every loop, the API and the command processor.

Transient means "the same operation can succeed later, unchanged": the
database or broker is unreachable, restarting, overloaded, or aborted our
transaction to resolve a conflict. Loops back off and retry a transient
error quietly; anything else is a request's fault or a bug and is logged
with its traceback.

The table, in order:

=========================================  =========  ==============================================
error                                      transient  why
=========================================  =========  ==============================================
:class:`ChronoqError` subclasses            its flag  each class says (``transient`` class attribute)
PostgreSQL SQLSTATE class 08                  yes      connection exception (connection lost, refused)
PostgreSQL SQLSTATE class 40                  yes      transaction rollback: serialization 40001,
                                                       deadlock 40P01 — retry the transaction
PostgreSQL SQLSTATE class 53                  yes      insufficient resources: too many connections
                                                       53300, out of memory, disk full
PostgreSQL SQLSTATE class 57                  yes      operator intervention: admin shutdown 57P01,
                                                       cannot connect now 57P03, query canceled by a
                                                       statement timeout 57014
PostgreSQL 55P03, 25P03                       yes      lock timeout; idle-in-transaction timeout
any other PostgreSQL error                    no       constraint violations, syntax, missing tables
asyncpg ``InterfaceError``                    yes      the connection was closed under us (e.g.
                                                       ``pg_terminate_backend``)...
  ... that is a ``ValueError`` or             no       bad query arguments, bad configuration,
  an unsupported feature                               a feature the client or server lacks
asyncpg ``InternalClientError``               yes      protocol state lost with the connection
aiokafka ``KafkaError``                    retriable   aiokafka's own ``retriable`` flag, plus
                                                       connection errors and timeouts
``OSError`` (``ConnectionError``,             yes      sockets, name resolution, timeouts
``TimeoutError``, ``asyncio.TimeoutError``)
anything else                                 no       a bug
=========================================  =========  ==============================================
"""

from __future__ import annotations

import asyncio

import asyncpg
from aiokafka import errors as kafka_errors

from schemas.errors import ChronoqError

#: SQLSTATE classes (first two characters) whose errors are transient.
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57"})
#: Single SQLSTATEs outside those classes that are transient.
TRANSIENT_SQLSTATES = frozenset({"55P03", "25P03"})

#: Everything a database call can raise when the server or the connection fails under it, for the handlers that
#: catch database failures by type: a terminated backend surfaces as any of them, asyncpg's InternalClientError
#: ("cannot switch to state ...; another operation is in progress") included — one uncaught ended an engine.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,  # TimeoutError (a pool acquire's) is one
)

_PERMANENT_INTERFACE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # asyncpg's DataError (bad arguments) and ClientConfigurationError are ValueErrors
    asyncpg.exceptions.UnsupportedClientFeatureError,
    asyncpg.exceptions.UnsupportedServerFeatureError,
)
_TRANSIENT_KAFKA_ERRORS: tuple[type[BaseException], ...] = (
    kafka_errors.KafkaConnectionError,
    kafka_errors.KafkaTimeoutError,  # aiokafka marks it not retriable; waiting longer can succeed
)


def is_transient(err: BaseException) -> bool:
    """True when retrying the same operation later can succeed (see the module's table)."""
    if isinstance(err, ChronoqError):
        return err.transient
    if isinstance(err, asyncpg.PostgresError):
        sqlstate = getattr(err, "sqlstate", None) or ""
        return sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES or sqlstate in TRANSIENT_SQLSTATES
    if isinstance(err, asyncpg.InterfaceError):
        return not isinstance(err, _PERMANENT_INTERFACE_ERRORS)
    if isinstance(err, asyncpg.InternalClientError):
        return True
    if isinstance(err, kafka_errors.KafkaError):
        return bool(err.retriable) or isinstance(err, _TRANSIENT_KAFKA_ERRORS)
    return isinstance(err, (OSError, asyncio.TimeoutError))
