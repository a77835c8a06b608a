"""The error classification table (schemas/error_classification.py) and the attributes edges map from."""

from __future__ import annotations

import asyncpg
import pytest
from aiokafka import errors as kafka_errors

from consumers.errors import (
    CommitOutcomeUnknown,
    InfrastructureError,
    OccurrenceCanceled,
    PermanentError,
    lost_connection,
)
from engine.api.app import _to_response
from engine.client import ApiError
from engine.control.command_processor import _error_of
from engine.rules.occurrence_states import Event, IllegalTransition, State
from schemas.error_classification import DATABASE_ERRORS, is_transient
from schemas.errors import (
    ChronoqError,
    Conflict,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    StackError,
)
from schemas.messages import MalformedMessage

pg = asyncpg.exceptions


@pytest.mark.parametrize(
    "error",
    [
        pg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),  # 08003
        pg.ConnectionFailureError("connection failure"),  # 08006
        pg.PostgresConnectionError("connection exception"),  # 08000
        pg.CannotConnectNowError("the database system is starting up"),  # 57P03
        pg.AdminShutdownError("terminating connection due to administrator command"),  # 57P01
        pg.QueryCanceledError("canceling statement due to statement timeout"),  # 57014
        pg.TooManyConnectionsError("sorry, too many clients already"),  # 53300
        pg.SerializationError("could not serialize access"),  # 40001
        pg.DeadlockDetectedError("deadlock detected"),  # 40P01
        pg.LockNotAvailableError("canceling statement due to lock timeout"),  # 55P03
        pg.IdleInTransactionSessionTimeoutError("terminating connection due to idle-in-transaction timeout"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.InternalClientError("protocol state lost"),
        pg.ProtocolError("unexpected message"),
        ConnectionResetError("reset by peer"),
        ConnectionRefusedError("refused"),
        OSError("network unreachable"),
        TimeoutError(),
        TimeoutError("timed out"),
        kafka_errors.KafkaConnectionError("broker unreachable"),
        kafka_errors.KafkaTimeoutError(),
        kafka_errors.RequestTimedOutError(),
        kafka_errors.NodeNotReadyError(),
        kafka_errors.NotLeaderForPartitionError(),
        kafka_errors.UnknownTopicOrPartitionError(),
        InfrastructureError("app database unreachable"),
        ApiError(503, "unavailable", "the database is unavailable"),
        ApiError(429, "quota_exceeded", "quota"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_transient_errors(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        pg.UniqueViolationError("duplicate key"),  # 23505
        pg.CheckViolationError("check constraint"),  # 23514
        pg.UndefinedTableError("relation does not exist"),  # 42P01
        pg.PostgresSyntaxError("syntax error"),  # 42601
        pg.CharacterNotInRepertoireError("invalid byte sequence"),  # 22021
        pg.DataError("data exception"),  # 22000
        asyncpg.exceptions._base.DataError("invalid input for query argument $1"),  # an InterfaceError and ValueError
        pg.UnsupportedClientFeatureError("feature"),
        kafka_errors.CommitFailedError("rebalanced"),
        kafka_errors.TopicAuthorizationFailedError(),
        kafka_errors.IllegalStateError("bug"),
        InvalidInput("expression", "is empty"),
        NotFound("schedule", "x"),
        Conflict("stale"),
        QuotaExceeded("max_active_schedules", 1, 2),
        StackError("not started"),
        MalformedMessage("not json"),
        IllegalTransition(State.DEAD, Event.STARTED),
        PermanentError("bad payload"),
        OccurrenceCanceled("canceled"),
        ApiError(422, "invalid_input", "bad", "expression"),
        KeyError("a bug"),
        ValueError("a bug"),
        RuntimeError("a bug"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_permanent_errors(error: BaseException) -> None:
    assert not is_transient(error)


def test_every_sqlstate_of_a_transient_class_is_transient() -> None:
    # Walk asyncpg's generated classes: the classification follows the SQLSTATE, not a list of types.
    def subclasses(cls: type) -> list[type]:
        found: list[type] = [cls]
        children: list[type] = cls.__subclasses__()
        for child in children:
            found.extend(subclasses(child))
        return found

    by_class: dict[bool, set[str]] = {True: set(), False: set()}
    for cls in subclasses(asyncpg.PostgresError):
        sqlstate = getattr(cls, "sqlstate", None)
        if not sqlstate:
            continue
        by_class[is_transient(cls("x"))].add(sqlstate)
    assert {state[:2] for state in by_class[True]} == {"08", "40", "53", "57", "55", "25"}
    assert all(state[:2] in {"08", "40", "53", "57"} or state in {"55P03", "25P03"} for state in by_class[True])
    assert "23505" in by_class[False] and "42P01" in by_class[False]


@pytest.mark.parametrize(
    "error, status, code, field",
    [
        (InvalidInput("time_zone", "unknown zone"), 422, "invalid_input", "time_zone"),
        (NotFound("schedule", "x"), 404, "not_found", None),
        (Conflict("cannot pause a canceled schedule"), 409, "conflict", None),
        (QuotaExceeded("max_fires_per_minute", 10, 11), 429, "quota_exceeded", "max_fires_per_minute"),
        (IllegalTransition(State.DEAD, Event.STARTED), 400, "error", None),
        (ChronoqError("anything else"), 400, "error", None),
    ],
)
def test_api_and_command_results_map_errors_from_their_attributes(error, status, code, field) -> None:
    response = _to_response(error)
    assert response.status == status
    expected = {"code": code, "message": str(error), **({"field": field} if field else {})}
    assert response.body == {"error": expected}
    assert _error_of(error) == expected  # a rejected command carries the same error as the API


def test_client_error_reflects_the_server_answer() -> None:
    error = ApiError(422, "invalid_input", "expression: is empty", "expression")
    assert (error.http_status, error.code, error.field, error.transient) == (422, "invalid_input", "expression", False)


@pytest.mark.parametrize(
    "err",
    [
        asyncpg.InternalClientError("cannot switch to state 11; another operation (2) is in progress"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.InterfaceError("cannot call Transaction.__aexit__(): the underlying connection is closed"),
        ConnectionResetError("reset by peer"),
        TimeoutError(),
    ],
)
def test_every_way_a_terminated_backend_surfaces_is_caught_as_a_database_error_and_retried(err):
    """What pg_terminate_backend raised in an engine's settle pass (InternalClientError) ended the process once:
    the loops that catch database failures by type catch DATABASE_ERRORS, and all of these are transient."""
    assert isinstance(err, DATABASE_ERRORS)
    assert is_transient(err)


class _ReleasedProxy:
    """What an asyncpg pool's connection proxy does once the server closed its connection: the pool took the
    holder back, and every call, is_closed() included, raises."""

    def is_closed(self) -> bool:
        raise asyncpg.InterfaceError(
            "cannot call Connection.is_closed(): connection has been released back to the pool"
        )


def test_a_connection_the_pool_took_back_after_the_server_closed_it_counts_as_lost():
    """Found in the suite: a worker paused past its lease woke to a lost COMMIT, and asking the released proxy
    whether it was closed raised instead of answering, so the failure was never reported."""
    assert lost_connection(RuntimeError("handler bug"), _ReleasedProxy())
    assert lost_connection(CommitOutcomeUnknown("the connection was lost during COMMIT"), None)
    assert not lost_connection(RuntimeError("handler bug"), None)
