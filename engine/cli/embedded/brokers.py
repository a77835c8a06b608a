"""The embedded Kafka-protocol broker by kind: tansu (the zero-configuration default) or Apache Kafka.

:func:`start_broker` is what ``chronoq up``, the test fixtures and the load
tests call; each gets an object with ``bootstrap``, ``pid`` and ``stop()``
whichever broker runs. docs/broker.md says what each kind provides.

Both brokers die with the *thread* that started them (``PR_SET_PDEATHSIG``
is per thread): start one from a thread that lives as long as the broker
should — the main thread, or an executor that is not shut down before the
broker is stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol, get_args

from engine.cli.embedded.apache_kafka import ApacheKafka, fetched, jars_directory, java_binary, missing_jars_message
from engine.cli.embedded.tansu import EmbeddedKafka
from schemas.errors import StackError

BrokerKind = Literal["tansu", "apache"]
BROKER_KINDS: tuple[BrokerKind, ...] = get_args(BrokerKind)
BROKER_NAMES: dict[str, str] = {"tansu": "tansu, memory only", "apache": "Apache Kafka 4.4, log on disk"}


class Broker(Protocol):
    """A running broker: its ``host:port`` bootstrap, its process id, and a clean stop."""

    @property
    def bootstrap(self) -> str | None: ...

    @property
    def pid(self) -> int | None: ...

    def stop(self) -> None: ...


def broker_kind(value: str) -> BrokerKind:
    """``value`` as a broker kind, or a StackError listing the kinds."""
    if value not in BROKER_KINDS:
        raise StackError(f"unknown broker kind {value!r}: choose one of {', '.join(BROKER_KINDS)}")
    return value


def apache_kafka_unavailable(env: Mapping[str, str] | None = None) -> str | None:
    """Why Apache Kafka cannot start here (no java, no cached jars, and how to fix it), or None."""
    try:
        java_binary(env)
    except StackError as err:
        return str(err)
    jars = jars_directory(env)
    if not fetched(jars):
        return missing_jars_message(jars)
    return None


def start_broker(kind: str, directory: Path, overrides: Mapping[str, str] | None = None) -> Broker:
    """Start a broker of ``kind`` keeping its files in ``directory``; return once it answers.

    ``overrides`` replaces Apache Kafka broker properties (tests shorten its
    timers with it); tansu has none to replace, so overrides for it are an
    error rather than silently ignored.
    """
    kind = broker_kind(kind)
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "tansu":
        if overrides:
            raise StackError("tansu takes no broker properties; overrides are for Apache Kafka")
        tansu = EmbeddedKafka(directory / "tansu.log")
        tansu.start()
        return tansu
    unavailable = apache_kafka_unavailable()
    if unavailable is not None:
        raise StackError(unavailable)
    apache = ApacheKafka(directory / "apache-kafka", overrides=overrides)
    apache.start()
    return apache
