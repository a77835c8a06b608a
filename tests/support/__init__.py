"""Test support that is not a fixture (fixtures live in tests/conftest.py and use these).

* :mod:`.databases` — the PostgreSQL server under test and creating/dropping its databases;
* :mod:`.brokers` — the brokers under test (tansu, Apache Kafka), their test timers, skipping without java;
* :mod:`.kafka_proxy` — a fault-injecting TCP proxy in front of a broker (drops a produce response);
* :mod:`.waiting` — :func:`wait_for`, awaiting a condition instead of sleeping;
* :mod:`.services` — a fast :class:`ServiceConfig`, running the engine's roles or a consumer app in the
  test's event loop;
* :mod:`.rows` — the one row factory: schedules, occurrences and outbox rows inserted directly, and
  reading them back;
* :mod:`.kafka` — occurrence messages, producing them, reading a topic, collecting attempt events;
* :mod:`.telemetry` — in-memory OpenTelemetry providers.
"""
