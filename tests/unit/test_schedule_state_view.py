"""The consumer's view of schedule versions (its pure part) and the consumer config checks."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from consumers import Cancellation, ConsumerConfig, OccurrenceCanceled
from consumers.schedule_states import (
    SCHEDULE_CANCELED,
    STALE_VERSION,
    ScheduleStateView,
)
from schemas.messages import ScheduleStateMessage

AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
SID = uuid.uuid4()


def state(version: int, value: str, schedule_id: uuid.UUID = SID) -> ScheduleStateMessage:
    return ScheduleStateMessage(schedule_id, "acme", version, value, AT)


@pytest.mark.parametrize(
    "messages, version, expected",
    [
        ([], 1, None),  # never heard of it: run
        ([state(1, "active")], 1, None),
        ([state(1, "active"), state(2, "active")], 1, STALE_VERSION),  # updated: version 1 is obsolete
        ([state(1, "active"), state(2, "paused")], 1, STALE_VERSION),
        ([state(2, "active")], 3, None),  # the view lags behind: run
        ([state(1, "active"), state(2, "canceled")], 1, SCHEDULE_CANCELED),
        ([state(3, "active"), state(2, "canceled")], 3, None),  # an older message arriving late changes nothing
    ],
)
def test_verdicts(messages, version, expected):
    view = ScheduleStateView()
    for message in messages:
        view.apply(message)
    assert view.verdict(SID, version) == expected


def test_a_running_handler_is_signalled_when_its_schedule_is_canceled():
    view = ScheduleStateView()
    view.apply(state(1, "active"))
    signal, other = Cancellation(), Cancellation()
    with view.watch(SID, signal), view.watch(uuid.uuid4(), other):
        view.apply(state(2, "paused"))
        assert not signal.is_canceled  # pause/update do not interrupt a running handler
        view.apply(state(3, "canceled"))
        assert signal.is_canceled and signal.reason == SCHEDULE_CANCELED
        assert not other.is_canceled
        with pytest.raises(OccurrenceCanceled):
            signal.raise_if_canceled()
    later = Cancellation()
    with view.watch(SID, later):  # watching an already canceled schedule
        assert later.is_canceled


def config(**overrides) -> ConsumerConfig:
    return ConsumerConfig("g", "127.0.0.1:9092", "postgresql:///x", **overrides)


def test_config_defaults_tie_the_transaction_limits_to_the_lease_and_the_handler_timeout():
    cfg = config(lease_ttl=12.0)
    cfg.validate()
    assert (cfg.renew_interval, cfg.idle_timeout, cfg.lock_timeout) == (4.0, 312.0, 12.0)


@pytest.mark.parametrize(
    "overrides",
    [
        {"lease_ttl": 0},
        {"lease_ttl": 10, "lease_renew_interval": 6},  # one lost heartbeat would expire the lease
        {"concurrency": 0},
        {"max_in_flight": 0},
        {"session_timeout": 1.0, "heartbeat_interval": 1.0},
        {"shutdown_grace": -1},
    ],
)
def test_config_rejects_inconsistent_settings(overrides):
    with pytest.raises(ValueError):
        config(**overrides).validate()
