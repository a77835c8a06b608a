"""Apache Kafka 4.4 (KRaft, no ZooKeeper) as an embedded broker, run from its Maven jars.

The production broker, beside the zero-configuration tansu broker: it keeps
its log on disk, supports the idempotent producer and compacts topics, so the
promises that depend on the broker can be tested on the real thing.

Two steps, both from this repository:

- :func:`fetch` copies Apache Kafka's jars from Maven Central into a cache
  outside the repository (``~/.cache/chronoq/kafka-4.4.0``, or
  ``CHRONOQ_KAFKA_JARS``) with ``mvn dependency:copy-dependencies`` on the
  small Maven project beside this module (``apache_kafka/pom.xml``). A fetch
  is complete only once its marker file is written, so an interrupted fetch is
  redone; a complete one is reused. ``chronoq kafka fetch`` runs it.
- :class:`ApacheKafka` formats KRaft storage in its data directory and runs
  one combined broker+controller on free loopback ports with the broker
  settings every chronoq Kafka uses (``apache_kafka/server.properties``, the
  file compose.yaml mounts too).

The JVM is started in its own session (a Ctrl-C meant for the parent does
not reach it) with ``PR_SET_PDEATHSIG``, so it dies with the thread that
started it even when that is SIGKILLed. The kernel ties the signal to the
starting *thread*: call :meth:`ApacheKafka.start` from a thread that lives as
long as the broker should (the main thread, or a thread pool that is not shut
down).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.cli.embedded.processes import die_with_parent, free_loopback_port, wait_for_exit
from engine.cli.endpoints import java_home_setting, kafka_jars_setting
from schemas.errors import StackError

KAFKA_VERSION = "4.4.0"

RESOURCES = Path(__file__).resolve().with_name("apache_kafka")
POM = RESOURCES / "pom.xml"
SERVER_PROPERTIES = RESOURCES / "server.properties"
LOG4J_CONFIG = RESOURCES / "log4j2.properties"

#: Written into the jar directory after a complete copy; names the pom it came from.
COMPLETE_MARKER = ".chronoq-fetch-complete"

#: JVM options for a broker that starts in seconds on a 2-core machine: a
#: small fixed heap, the serial collector, the C1 compiler only (most of the
#: start-up is class loading and cold code), the JDK's class-data archive,
#: no hsperfdata file in /tmp and no JMX. An out-of-memory broker exits
#: instead of limping on half-alive.
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms512m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
#: The same with C2 as well as C1 (what the launcher stops at to start faster): for benchmarks that compare
#: the two (load_tests/broker_produce.py, hour_top --apache-jit full); C2 lost on two cores both times.
FULL_JIT_JVM_OPTIONS: tuple[str, ...] = tuple(o for o in JVM_OPTIONS if not o.startswith("-XX:TieredStopAtLevel"))
_FORMAT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:-UsePerfData",
)

_LOOPBACK = "127.0.0.1"
_LOG_TAIL = 3000


def jars_directory(env: Mapping[str, str] | None = None) -> Path:
    """Where Apache Kafka's jars are cached: ``CHRONOQ_KAFKA_JARS`` or ``~/.cache/chronoq/kafka-4.4.0``."""
    return kafka_jars_setting(env) or Path.home() / ".cache" / "chronoq" / f"kafka-{KAFKA_VERSION}"


def java_binary(env: Mapping[str, str] | None = None) -> str:
    """``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on PATH; a clear error when neither exists."""
    java_home = java_home_setting(env)
    if java_home is not None:
        candidate = java_home / "bin" / "java"
        if not os.access(candidate, os.X_OK):
            raise StackError(
                f"JAVA_HOME is {java_home}, but {candidate} is not an executable java;"
                " point JAVA_HOME at a JDK or JRE 17 or newer, or unset it to use java on PATH"
            )
        return str(candidate)
    found = shutil.which("java", path=None if env is None else env.get("PATH"))
    if found is None:
        raise StackError(
            "no java on PATH and JAVA_HOME is not set: Apache Kafka 4.4 needs Java 17 or newer"
            " (e.g. apt-get install openjdk-17-jre-headless)"
        )
    return found


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def fetched(directory: Path) -> bool:
    """True when ``directory`` holds a complete copy of the jars the current pom lists."""
    marker = directory / COMPLETE_MARKER
    try:
        first_line = marker.read_text().splitlines()[0]
    except (OSError, IndexError):
        return False
    return first_line == f"pom-sha256 {_pom_digest()}"


def missing_jars_message(directory: Path) -> str:
    return (
        f"Apache Kafka {KAFKA_VERSION}'s jars are not in {directory}: fetch them once with"
        " `chronoq kafka fetch` (needs Maven and Maven Central; CHRONOQ_KAFKA_JARS chooses another"
        " directory)"
    )


def fetch(
    destination: Path | None = None, *, maven_repo: Path | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """Copy Apache Kafka's jars into ``destination`` (default :func:`jars_directory`) unless already there.

    The copy goes to a staging directory beside the destination, gets its
    marker there and is renamed into place, so the destination is either
    absent, left from an interrupted or outdated fetch (no or another marker:
    replaced), or complete. ``maven_repo`` overrides Maven's local repository
    (default ``~/.m2/repository``). Returns the directory.
    """
    destination = (destination or jars_directory(env)).resolve()
    if fetched(destination):
        return destination
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            "Maven (mvn) is not on PATH: it fetches Apache Kafka's jars from Maven Central (e.g. apt-get install maven)"
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{destination.name}.partial-", dir=destination.parent))
    try:
        command = [mvn, "-B", "-q", "-f", str(POM), "dependency:copy-dependencies", f"-DoutputDirectory={staging}"]
        if maven_repo is not None:
            command.append(f"-Dmaven.repo.local={maven_repo}")
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-_LOG_TAIL:]
            raise StackError(
                f"mvn could not fetch Apache Kafka {KAFKA_VERSION} (exit status {result.returncode}):\n{output}"
            )
        jars = sorted(path.name for path in staging.glob("*.jar"))
        if f"kafka_2.13-{KAFKA_VERSION}.jar" not in jars:
            raise StackError(f"mvn finished but copied no kafka_2.13-{KAFKA_VERSION}.jar into {staging}")
        (staging / COMPLETE_MARKER).write_text(f"pom-sha256 {_pom_digest()}\n" + "\n".join(jars) + "\n")
        if destination.exists():
            if fetched(destination):  # a concurrent fetch finished first
                return destination
            shutil.rmtree(destination)
        try:
            staging.rename(destination)
        except OSError:
            if not fetched(destination):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return destination


def _cluster_id() -> str:
    # Kafka's Uuid string form: 16 random bytes, URL-safe base64 without
    # padding. Kafka itself never hands out ids starting with '-' (they read
    # as command-line options), so neither do we.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data.extend(chunk)
    return bytes(data)


def metadata_brokers(port: int, timeout: float = 1.0) -> int:
    """How many brokers a Metadata request (v4) to 127.0.0.1:``port`` reports.

    Raw protocol on purpose: the launcher is synchronous and must not need an
    event loop. Version 4 is the oldest Metadata version Kafka 4.x still
    accepts and the newest without the flexible (tagged-field) encoding. It
    asks for all topics and never creates one.
    """
    client_id = b"chronoq-launcher"
    request = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id + struct.pack(">i?", -1, False)
    with socket.create_connection((_LOOPBACK, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        payload = _recv_exact(sock, size)
    _correlation_id, _throttle_ms, brokers = struct.unpack_from(">iii", payload)
    return brokers


class ApacheKafka:
    """One Apache Kafka node (KRaft broker+controller) whose log and configuration live in ``data_dir``.

    :meth:`start` formats the storage the first time and starts the JVM; it
    returns once the broker answers a Metadata request. Stopping and starting
    again (also after :meth:`kill`) reuses the same log directory and the same
    ports, so clients holding :attr:`bootstrap` reconnect to the restarted
    broker. ``overrides`` replaces or adds broker properties (tests use it for
    settings that differ from production, such as shorter group sessions).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        jars: Path | None = None,
        java: str | None = None,
        overrides: Mapping[str, str] | None = None,
        listeners: Mapping[str, str] | None = None,
        scram_users: Sequence[str] = (),
        jvm_options: Sequence[str] = JVM_OPTIONS,
        start_timeout: float = 60.0,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.jars = jars
        self.java = java
        self.overrides = dict(overrides or {})
        self.listeners = dict(listeners or {})
        self.scram_users = tuple(scram_users)
        self.listener_ports: dict[str, int] = {}
        self.jvm_options = tuple(jvm_options)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.broker_port: int | None = None
        self.controller_port: int | None = None
        self._log_offset = 0

    @property
    def bootstrap(self) -> str | None:
        """``127.0.0.1:port`` of the broker listener once ports are chosen (the same across restarts)."""
        return f"{_LOOPBACK}:{self.broker_port}" if self.broker_port else None

    def listener_bootstrap(self, name: str) -> str:
        """``127.0.0.1:port`` of the extra listener ``name`` (after :meth:`start`)."""
        return f"{_LOOPBACK}:{self.listener_ports[name]}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        """The JVM's output: the storage tool's and the server's log lines."""
        return self.data_dir / "server.log"

    @property
    def log_dir(self) -> Path:
        """Kafka's ``log.dirs``: topic partitions and the KRaft metadata log."""
        return self.data_dir / "logs"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    def start(self, attempts: int = 3) -> str:
        """Format storage if needed, start the broker and wait until it answers metadata; return the bootstrap."""
        if self.process is not None and self.process.poll() is None:
            raise StackError(f"Apache Kafka is already running in {self.data_dir} (pid {self.process.pid})")
        java = self.java or java_binary()
        jars = self.jars or jars_directory()
        if not fetched(jars):
            raise StackError(missing_jars_message(jars))
        classpath = str(jars / "*")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        restart = self.broker_port is not None
        last_error = "no attempt made"
        for _ in range(attempts):
            if not restart:
                self._choose_ports()
            self._write_properties()
            if not (self.log_dir / "meta.properties").exists():
                self._format(java, classpath)
            try:
                self._launch(java, classpath)
                self._await_metadata()
                return self.bootstrap  # type: ignore[return-value]
            except _PortTaken as err:
                # Free a moment ago, taken since (another process won the race):
                # a first start tries new ports; a restart must keep its own.
                last_error = str(err)
                if restart:
                    break
            except BaseException:
                self.kill()  # a half-started JVM (Ctrl-C, a timeout) is not left behind
                raise
        raise StackError(f"could not start Apache Kafka in {self.data_dir}: {last_error}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown that flushes and closes the log) and wait; SIGKILL after ``timeout``."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is not None:
            return
        process.terminate()
        if not wait_for_exit(process.pid, timeout):
            process.kill()
        process.wait()

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would, and reap it: no shutdown hook runs, the page cache stays."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.kill()
        process.wait()

    def _choose_ports(self) -> None:
        chosen: set[int] = set()

        def port() -> int:
            candidate = free_loopback_port()
            while candidate in chosen:
                candidate = free_loopback_port()
            chosen.add(candidate)
            return candidate

        self.broker_port, self.controller_port = port(), port()
        self.listener_ports = {name: port() for name in self.listeners}

    def _write_properties(self) -> None:
        extra = "".join(f",{name}://{_LOOPBACK}:{port}" for name, port in self.listener_ports.items())
        node = {
            "listeners": f"PLAINTEXT://{_LOOPBACK}:{self.broker_port},CONTROLLER://{_LOOPBACK}:{self.controller_port}"
            + extra,
            "advertised.listeners": f"PLAINTEXT://{_LOOPBACK}:{self.broker_port}" + extra,
            "controller.quorum.voters": f"1@{_LOOPBACK}:{self.controller_port}",
            "log.dirs": str(self.log_dir),
            **self.overrides,
        }
        if self.listeners:
            node["listener.security.protocol.map"] = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT" + "".join(
                f",{name}:{protocol}" for name, protocol in self.listeners.items()
            )
        # Later lines win in a Java properties file, so the template is copied
        # whole (its comments explain it) and the node's lines follow.
        lines = [f"{key}={value}" for key, value in node.items()]
        text = SERVER_PROPERTIES.read_text() + "\n# This node (written by the chronoq launcher):\n" + "\n".join(lines)
        self.properties_path.write_text(text + "\n")

    def _format(self, java: str, classpath: str) -> None:
        command = [
            java,
            *_FORMAT_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(self.properties_path),
            "--cluster-id",
            _cluster_id(),
            "--ignore-formatted",
            *(argument for user in self.scram_users for argument in ("--add-scram", user)),
        ]
        with open(self.log_path, "ab") as log:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                timeout=self.start_timeout,
            )
        if result.returncode != 0:
            raise StackError(
                f"formatting Kafka storage in {self.log_dir} failed (exit status"
                f" {result.returncode}); the end of {self.log_path}:\n{self._log_tail()}"
            )

    def _launch(self, java: str, classpath: str) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [
            java,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(self.properties_path),
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                # Its own session and process group: a Ctrl-C meant for `chronoq up`
                # or pytest must not stop the broker before its clients have.
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def _await_metadata(self) -> None:
        assert self.process is not None and self.broker_port is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process.poll() is not None:
                status = self.process.returncode
                self.process = None
                since_launch = self._log_tail(since=self._log_offset)
                if "Address already in use" in since_launch:
                    raise _PortTaken(f"port {self.broker_port} or {self.controller_port} is taken")
                raise StackError(
                    f"Apache Kafka exited with status {status} during start-up; the end of"
                    f" {self.log_path}:\n{self._log_tail()}"
                )
            try:
                if metadata_brokers(self.broker_port) > 0:
                    return
            except (OSError, struct.error):
                pass  # not listening yet, or closed the connection while starting
            if time.monotonic() > deadline:
                self.kill()
                raise StackError(
                    f"Apache Kafka did not answer metadata on {self.bootstrap} within"
                    f" {self.start_timeout:g} s; the end of {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self, since: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(since, log.seek(0, os.SEEK_END) - _LOG_TAIL))
                return log.read().decode(errors="replace")
        except OSError:
            return "(no server log)"


class _PortTaken(StackError):
    """A listener port chosen free was bound by someone else before the broker took it."""
