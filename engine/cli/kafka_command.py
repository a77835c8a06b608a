"""``chronoq kafka fetch``: copy Apache Kafka's jars from Maven Central into the cache, once;
``chronoq kafka acls --tenant T``: print (or ``--apply``) the ACLs of tenant T's consumer app.

``chronoq up --kafka apache`` and the test suite's ``[apache]`` tier run
Apache Kafka 4.4 from these jars; tansu, the default broker, needs nothing.
The ACLs are ``engine/control/kafka_acls.py``'s; docs/security.md explains them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from engine.cli import print_json
from engine.cli.embedded.apache_kafka import KAFKA_VERSION, fetch, fetched, jars_directory
from engine.cli.endpoints import resolve_kafka, with_engine_pool
from engine.control import targets
from engine.control.kafka_acls import apply_acls, consumer_acls


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


def cmd_acls(args: argparse.Namespace) -> int:
    async def main() -> None:
        names = list(args.target or [])
        if not names:  # the tenant's targets (owned or granted) from the engine database
            names = [t.target for t in await with_engine_pool(lambda pool: targets.list_targets(pool, args.tenant))]
        bindings = consumer_acls(args.tenant, names, args.principal, args.group_prefix)
        bootstrap, security = resolve_kafka() if args.apply else ("BOOTSTRAP", None)
        if security is not None:
            await apply_acls(bootstrap, security, bindings)
        if args.json:
            print_json({"tenant": args.tenant, "applied": args.apply, "acls": [b.to_json() for b in bindings]}, True)
            return
        count = f"{len(names)} target" + ("" if len(names) == 1 else "s")
        print(f"# ACLs of tenant {args.tenant}'s consumer app ({count})", flush=True)
        for binding in bindings:
            print(binding.kafka_acls_command(bootstrap), flush=True)
        if args.apply:
            print(f"# applied on {bootstrap}", flush=True)

    asyncio.run(main())
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
    acls = actions.add_parser(
        "acls",
        help="print (or --apply) the ACLs that let a tenant's consumer app read its targets and report attempts",
    )
    acls.add_argument("--tenant", required=True, help="the tenant id")
    acls.add_argument(
        "--target",
        action="append",
        help="a target of the app (repeatable; default: every target the tenant owns or was granted)",
    )
    acls.add_argument("--principal", help="the app's Kafka principal (default User:<tenant>)")
    acls.add_argument(
        "--group-prefix", help="prefix of the app's consumer group names (default '<tenant>.', a prefixed ACL)"
    )
    acls.add_argument(
        "--apply",
        action="store_true",
        help="create the topics and the ACLs on the broker (as CHRONOQ_KAFKA_*'s principal, which needs ALTER)",
    )
    acls.add_argument("--json", action="store_true", help="print the ACLs as one JSON object")
    acls.set_defaults(func=cmd_acls)
