"""``chronoq kafka fetch``: copy Apache Kafka's jars from Maven Central into the cache, once.

``chronoq up --kafka apache`` and the test suite's ``[apache]`` tier run
Apache Kafka 4.4 from these jars; tansu, the default broker, needs nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from engine.cli.embedded.apache_kafka import KAFKA_VERSION, fetch, fetched, jars_directory


def cmd_fetch(args: argparse.Namespace) -> int:
    destination = (args.jars or jars_directory()).resolve()
    if fetched(destination):
        print(f"Apache Kafka {KAFKA_VERSION} jars already in {destination}", flush=True)
        return 0
    began = time.monotonic()
    print(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central into {destination} ...", flush=True)
    fetch(destination, maven_repo=args.maven_repo)  # a StackError says what is missing (mvn, the network)
    print(
        f"Apache Kafka {KAFKA_VERSION} jars fetched into {destination} in {time.monotonic() - began:.1f} s", flush=True
    )
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    kafka = commands.add_parser(
        "kafka",
        help="Apache Kafka for the embedded stack: fetch its jars",
        description=f"Apache Kafka {KAFKA_VERSION} for `chronoq up --kafka apache` and"
        " the tests. Needs Java 17+ to run and Maven to fetch.",
    )
    actions = kafka.add_subparsers(dest="kafka_command", required=True, metavar="ACTION")
    fetch_parser = actions.add_parser(
        "fetch", help="copy the jars from Maven Central into the cache (once; reused when complete)"
    )
    fetch_parser.add_argument(
        "--jars",
        type=Path,
        help=f"the cache directory (default: CHRONOQ_KAFKA_JARS or ~/.cache/chronoq/kafka-{KAFKA_VERSION})",
    )
    fetch_parser.add_argument("--maven-repo", type=Path, help="Maven's local repository (default ~/.m2/repository)")
    fetch_parser.set_defaults(func=cmd_fetch)
