"""Where a chronoq command finds its database and broker.

The only module that reads environment variables (all under ``CHRONOQ_``):

- ``CHRONOQ_DATABASE_URL`` and ``CHRONOQ_KAFKA_BOOTSTRAP``: an external
  PostgreSQL and Kafka. When both are set every command uses them and starts
  nothing.
- ``CHRONOQ_CONSUMER_DATABASE_URL``: the database of the built-in consumer
  (``chronoq consume``). With it and ``CHRONOQ_KAFKA_BOOTSTRAP`` a consumer
  needs nothing of the engine; without it, the consumer shares
  ``CHRONOQ_DATABASE_URL`` (the dedupe table has its own name).
- ``CHRONOQ_HOME``: where the embedded stack keeps its data and its state
  file (default ``./.chronoq``).
- ``CHRONOQ_KAFKA_JARS`` and ``JAVA_HOME``: where the embedded Apache Kafka
  finds its cached jars (default ``~/.cache/chronoq/kafka-<version>``) and its
  JDK (default ``java`` on PATH); only ``chronoq up --kafka apache``,
  ``chronoq kafka fetch`` and the tests read them.
- ``CHRONOQ_KAFKA_IDEMPOTENT``: ``1`` makes the relay use the idempotent
  producer on an external broker (Apache Kafka supports it, tansu does not);
  an embedded stack records its broker kind in the state file instead.
- ``CHRONOQ_KAFKA_SECURITY_PROTOCOL`` (``PLAINTEXT``, ``SSL``,
  ``SASL_PLAINTEXT``, ``SASL_SSL``), ``CHRONOQ_KAFKA_SASL_MECHANISM``
  (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``),
  ``CHRONOQ_KAFKA_SASL_USERNAME`` / ``_PASSWORD``, ``CHRONOQ_KAFKA_SSL_CAFILE``,
  ``CHRONOQ_KAFKA_SSL_CERTFILE`` / ``_KEYFILE``,
  ``CHRONOQ_KAFKA_SSL_CHECK_HOSTNAME``: how every Kafka client of the command
  authenticates to an external broker (:func:`kafka_security_setting`; the
  embedded brokers are plaintext). The password is never printed.

Each command asks for what it uses: the engine and the relay need both the
database and Kafka (:func:`resolve_endpoints`); the API, migrations, tenant,
schedule and dead-letter commands only the database
(:func:`resolve_database_url`); a consumer Kafka and its own database
(:func:`resolve_consumer_endpoints`). Without the external URLs, commands
other than ``up`` read the state file that a running ``chronoq up`` wrote.
"""

from __future__ import annotations

import os
import tempfile
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import asyncpg
import orjson
import psutil

from schemas.connections import create_pool
from schemas.errors import StackError
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, KafkaSecurityError

T = TypeVar("T")

STATE_FILE = "stack.json"


@dataclass(frozen=True)
class Endpoints:
    """Where the services find their database and broker."""

    database_url: str
    kafka_bootstrap: str
    consumer_database_url: str
    embedded: bool = False
    #: The broker has the idempotent producer (Apache Kafka; tansu lacks InitProducerId).
    idempotent_producer: bool = False
    #: The embedded broker's kind (``tansu`` or ``apache``), ``external`` for a broker chronoq did not start.
    kafka_kind: str = "external"
    #: TLS and SASL of every Kafka client (from ``CHRONOQ_KAFKA_SECURITY_PROTOCOL`` and the rest).
    kafka_security: KafkaSecurity = PLAINTEXT


@dataclass(frozen=True)
class StackState:
    """What ``chronoq up`` publishes about the stack it runs."""

    pid: int
    database_url: str
    kafka_bootstrap: str
    consumer_database_url: str
    api_url: str | None = None
    postgres_pid: int | None = None
    kafka_pid: int | None = None
    kafka_kind: str = "tansu"

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(
            self.database_url,
            self.kafka_bootstrap,
            self.consumer_database_url,
            embedded=True,
            idempotent_producer=self.kafka_kind == "apache",
            kafka_kind=self.kafka_kind,
        )


def home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("CHRONOQ_HOME") or ".chronoq").resolve()


def external_endpoints(env: Mapping[str, str] | None = None) -> Endpoints | None:
    """Endpoints from the environment, or None when the embedded stack is meant."""
    env = os.environ if env is None else env
    database_url = env.get("CHRONOQ_DATABASE_URL")
    bootstrap = env.get("CHRONOQ_KAFKA_BOOTSTRAP")
    if not database_url and not bootstrap:
        return None
    if not (database_url and bootstrap):
        missing = "CHRONOQ_KAFKA_BOOTSTRAP" if database_url else "CHRONOQ_DATABASE_URL"
        raise StackError(
            f"{missing} is not set: set both CHRONOQ_DATABASE_URL and CHRONOQ_KAFKA_BOOTSTRAP"
            " to use an external stack, or neither to use the embedded one"
        )
    return Endpoints(
        database_url,
        bootstrap,
        env.get("CHRONOQ_CONSUMER_DATABASE_URL") or database_url,
        idempotent_producer=_flag(env, "CHRONOQ_KAFKA_IDEMPOTENT"),
        kafka_security=kafka_security_setting(env),
    )


#: The environment variable of each :class:`KafkaSecurity` field.
KAFKA_SECURITY_VARIABLES = {
    "protocol": "CHRONOQ_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "CHRONOQ_KAFKA_SASL_MECHANISM",
    "sasl_username": "CHRONOQ_KAFKA_SASL_USERNAME",
    "sasl_password": "CHRONOQ_KAFKA_SASL_PASSWORD",
    "ssl_cafile": "CHRONOQ_KAFKA_SSL_CAFILE",
    "ssl_certfile": "CHRONOQ_KAFKA_SSL_CERTFILE",
    "ssl_keyfile": "CHRONOQ_KAFKA_SSL_KEYFILE",
    "ssl_check_hostname": "CHRONOQ_KAFKA_SSL_CHECK_HOSTNAME",
}
#: The names KafkaSecurity's validation uses for a field, as the CLI's variables (its errors name them).
_SECURITY_FIELD_VARIABLES = {
    **KAFKA_SECURITY_VARIABLES,
    "security_protocol": "CHRONOQ_KAFKA_SECURITY_PROTOCOL",
}


def kafka_security_setting(env: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The Kafka clients' TLS and SASL from ``CHRONOQ_KAFKA_*`` (PLAINTEXT when none is set), validated.

    The protocol and mechanism are case-insensitive; file paths are expanded (``~``) and must exist;
    a StackError names the variable at fault, never the password's value.
    """
    env = os.environ if env is None else env
    values = {name: env.get(variable, "").strip() for name, variable in KAFKA_SECURITY_VARIABLES.items()}
    values["sasl_password"] = env.get(KAFKA_SECURITY_VARIABLES["sasl_password"], "")  # spaces may be part of it
    files: dict[str, str | None] = {}
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        files[name] = str(Path(values[name]).expanduser()) if values[name] else None
        if files[name] and not Path(files[name] or "").is_file():
            raise StackError(f"{KAFKA_SECURITY_VARIABLES[name]} is {values[name]!r}: no such file")
    security = KafkaSecurity(
        protocol=values["protocol"].upper() or "PLAINTEXT",
        sasl_mechanism=values["sasl_mechanism"].upper() or "PLAIN",
        sasl_username=values["sasl_username"] or None,
        sasl_password=values["sasl_password"] or None,
        ssl_check_hostname=not values["ssl_check_hostname"]
        or _flag(env, KAFKA_SECURITY_VARIABLES["ssl_check_hostname"]),
        **files,
    )
    try:
        security.validate()
    except KafkaSecurityError as err:
        variable = _SECURITY_FIELD_VARIABLES.get(err.field or "", "CHRONOQ_KAFKA_SECURITY_PROTOCOL")
        raise StackError(f"{variable}: {err.problem}") from None
    return security


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (a database URL printed by ``up`` or ``status``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise StackError(f"{name} is {env[name]!r}: use 1 or 0")


def kafka_jars_setting(env: Mapping[str, str] | None = None) -> Path | None:
    """``CHRONOQ_KAFKA_JARS``: where the embedded Apache Kafka's jars are cached, if set."""
    env = os.environ if env is None else env
    configured = env.get("CHRONOQ_KAFKA_JARS")
    return Path(configured).expanduser().resolve() if configured else None


def java_home_setting(env: Mapping[str, str] | None = None) -> Path | None:
    """``JAVA_HOME``, if set: the JDK the embedded Apache Kafka runs on."""
    env = os.environ if env is None else env
    configured = env.get("JAVA_HOME")
    return Path(configured) if configured else None


def write_state(state: StackState, directory: Path) -> Path:
    """Write the state file atomically (readers never see half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / STATE_FILE
    with tempfile.NamedTemporaryFile("wb", dir=directory, delete=False) as tmp:
        tmp.write(orjson.dumps(asdict(state), option=orjson.OPT_INDENT_2))
    os.replace(tmp.name, target)
    return target


def read_state(directory: Path) -> StackState | None:
    """The state of a live ``chronoq up`` in ``directory``, or None."""
    path = directory / STATE_FILE
    try:
        state = StackState(**orjson.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, TypeError) as err:
        raise StackError(f"{path} is damaged ({err}); delete it and start chronoq up again") from err
    if not psutil.pid_exists(state.pid):
        return None
    return state


def clear_state(directory: Path) -> None:
    (directory / STATE_FILE).unlink(missing_ok=True)


def resolve_endpoints(env: Mapping[str, str] | None = None) -> Endpoints:
    """Endpoints for a command that needs a running stack."""
    external = external_endpoints(env)
    if external is not None:
        return external
    directory = home(env)
    state = read_state(directory)
    if state is None:
        raise StackError(
            f"no running chronoq stack found in {directory}; start one with `chronoq up`"
            " (or set CHRONOQ_HOME to its directory), or set CHRONOQ_DATABASE_URL and"
            " CHRONOQ_KAFKA_BOOTSTRAP to use an external PostgreSQL and Kafka"
        )
    return state.endpoints


def resolve_database_url(env: Mapping[str, str] | None = None) -> str:
    """The engine database, for a command that needs nothing else (api, migrate, tenant, schedule, dlq).

    ``CHRONOQ_DATABASE_URL`` alone is enough; without it, a running ``chronoq up``'s.
    """
    env = os.environ if env is None else env
    database_url = env.get("CHRONOQ_DATABASE_URL")
    if database_url:
        return database_url
    return resolve_endpoints(env).database_url


async def with_engine_pool(call: Callable[[asyncpg.Pool], Awaitable[T]], max_size: int = 1) -> T:
    """``await call(pool)`` on a pool of the engine database (:func:`resolve_database_url`), closed after:
    what a one-shot command (tenant, operator, dlq, history) needs."""
    pool = await create_pool(resolve_database_url(), min_size=1, max_size=max_size)
    try:
        return await call(pool)
    finally:
        await pool.close()


def resolve_kafka(env: Mapping[str, str] | None = None) -> tuple[str, KafkaSecurity]:
    """The broker alone (``chronoq kafka acls --apply``): ``CHRONOQ_KAFKA_BOOTSTRAP`` with its security,
    else a running ``chronoq up``'s."""
    env = os.environ if env is None else env
    bootstrap = env.get("CHRONOQ_KAFKA_BOOTSTRAP")
    if bootstrap:
        return bootstrap, kafka_security_setting(env)
    endpoints = resolve_endpoints(env)
    return endpoints.kafka_bootstrap, endpoints.kafka_security


def resolve_consumer_endpoints(env: Mapping[str, str] | None = None) -> Endpoints:
    """Endpoints for a consumer app: Kafka and its own database, never the engine's."""
    env = os.environ if env is None else env
    bootstrap = env.get("CHRONOQ_KAFKA_BOOTSTRAP")
    consumer_url = env.get("CHRONOQ_CONSUMER_DATABASE_URL")
    if bootstrap and consumer_url:
        return Endpoints(
            database_url="",
            kafka_bootstrap=bootstrap,
            consumer_database_url=consumer_url,
            kafka_security=kafka_security_setting(env),
        )
    return resolve_endpoints(env)
