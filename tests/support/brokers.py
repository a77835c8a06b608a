"""The brokers the tests run on: tansu and Apache Kafka, with the test timers Apache Kafka needs.

The ``broker`` fixture (tests/conftest.py) is parametrized over
:data:`engine.cli.embedded.brokers.BROKER_KINDS`, so every test that touches
Kafka runs once per broker and its id names the broker (``[tansu]``,
``[apache]``). ``pytest --broker tansu`` (or ``apache``) runs one kind only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from engine.cli.embedded.brokers import apache_kafka_unavailable

#: Timers that differ from production so the tests wait seconds, not tens of
#: seconds; none of them changes what the broker guarantees.
BROKER_TEST_OVERRIDES = {
    # After a SIGKILL the node's previous registration lives until its broker
    # session expires (9 s by default): the restarted broker cannot register,
    # and so cannot serve, before then.
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    # The log cleaner sleeps 15 s whenever it found nothing to clean, so the
    # first compaction of a new topic took ~15 s (measured); 100 ms: ~0.7 s.
    "log.cleaner.backoff.ms": "100",
    # The suite's consumer groups use 2 s sessions (tests/support/services.py:
    # a member killed by a test is noticed in 2 s, not 10); Apache Kafka
    # rejects sessions below this minimum, 6 s by default.
    "group.min.session.timeout.ms": "1000",
}

#: The environment variable that turns "Apache Kafka cannot run here" from a
#: skip into a failure (CI sets it after fetching the jars).
REQUIRE_APACHE_KAFKA = "CHRONOQ_REQUIRE_APACHE_KAFKA"


@dataclass(frozen=True)
class BrokerUnderTest:
    """The broker a test runs on: its kind (``tansu``, ``apache`` or ``external``) and bootstrap."""

    kind: str
    bootstrap: str

    @property
    def idempotent_producer(self) -> bool:
        """Whether the broker has InitProducerId (tansu does not; an external broker is not assumed to)."""
        return self.kind == "apache"


def require_apache_kafka() -> None:
    """Skip the test (with the reason) when Apache Kafka cannot run here; fail instead under CI."""
    unavailable = apache_kafka_unavailable()
    if unavailable is None:
        return
    if os.environ.get(REQUIRE_APACHE_KAFKA):
        pytest.fail(f"{REQUIRE_APACHE_KAFKA} is set but Apache Kafka cannot run: {unavailable}")
    pytest.skip(f"Apache Kafka cannot run here: {unavailable}")
