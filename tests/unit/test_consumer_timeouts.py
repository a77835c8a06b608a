"""Consumer timeouts that agree: a handler within its timeout can always commit (ConsumerConfig.validate)."""

from __future__ import annotations

import pytest

from consumers import ConsumerConfig


def config(**overrides) -> ConsumerConfig:
    return ConsumerConfig("g", "127.0.0.1:9092", "postgresql:///x", **overrides)


def test_the_defaults_let_a_handler_idle_in_its_transaction_for_its_whole_timeout():
    """Why: "Timeouts disagree". The idle-in-transaction limit was the lease ttl (30 s) while handlers had
    300 s: a handler with more than 30 s of work outside the database failed every attempt and went DEAD."""
    cfg = config()
    cfg.validate()
    assert cfg.idle_timeout > cfg.handler_timeout
    assert (cfg.handler_timeout, cfg.lease_ttl, cfg.idle_timeout) == (300.0, 30.0, 330.0)
    assert config(handler_timeout=20.0, lease_ttl=5.0).idle_timeout == 25.0  # follows both


@pytest.mark.parametrize(
    ("handler_timeout", "idle_timeout"),
    [(300.0, 30.0), (60.0, 60.0)],  # the old default pair; equal leaves no time to commit
)
def test_an_idle_limit_a_handler_within_its_timeout_could_reach_is_rejected(handler_timeout, idle_timeout):
    with pytest.raises(ValueError, match="transaction_idle_timeout .* must exceed handler_timeout"):
        config(handler_timeout=handler_timeout, transaction_idle_timeout=idle_timeout).validate()


def test_a_short_idle_limit_with_a_shorter_handler_timeout_is_accepted():
    config(lease_ttl=3.0, handler_timeout=1.0, transaction_idle_timeout=2.0).validate()


@pytest.mark.parametrize(
    ("overrides", "target_timeout", "idle"),
    [
        ({}, 60.0, 330.0),  # below the app's limit: the app's (handler_timeout 300 + lease 30)
        ({}, 600.0, 630.0),  # above it: the target's timeout + the lease
        ({}, 330.0, 360.0),  # equal leaves no time to commit: raised too
        ({"transaction_idle_timeout": 40.0, "handler_timeout": 20.0}, 30.0, 40.0),
        ({"transaction_idle_timeout": 40.0, "handler_timeout": 20.0}, 90.0, 120.0),
    ],
)
def test_a_targets_idle_limit_always_exceeds_its_handler_timeout(overrides, target_timeout, idle):
    """Why: `@app.handler(target, timeout=...)` above transaction_idle_timeout could never commit a handler
    that used its time outside the database. The limit is set per target (SET LOCAL in its transaction)."""
    cfg = config(**overrides)
    cfg.validate()
    assert cfg.idle_timeout_for(target_timeout) == idle > target_timeout


def test_registration_gives_the_target_its_own_idle_limit():
    from consumers import ConsumerApp

    app = ConsumerApp(config())

    @app.handler("slow.report", timeout=900.0)
    async def slow(occurrence, conn) -> None:  # pragma: no cover - not called
        pass

    @app.handler("quick.ping")
    async def quick(occurrence, conn) -> None:  # pragma: no cover - not called
        pass

    slow_registration, quick_registration = (
        app.handlers.for_target("slow.report"),
        app.handlers.for_target("quick.ping"),
    )
    assert slow_registration is not None and quick_registration is not None
    assert slow_registration.idle_limit(app.config) == 930.0
    assert quick_registration.idle_limit(app.config) == app.config.idle_timeout == 330.0


@pytest.mark.parametrize(
    ("wait", "message"), [(0.0, "fetch_wait must be positive"), (-0.05, "must be positive"), (60.0, "at most 10 s")]
)
def test_a_fetch_wait_out_of_range_is_rejected(wait: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(fetch_wait=wait).validate()
    config(fetch_wait=0.05).validate()  # what the CLI's consumers use on tansu
    config(fetch_wait=10.0).validate()
