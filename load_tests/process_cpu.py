"""CPU seconds of the stack's processes, by role, from Linux /proc: where a burst's CPU goes.

Used by ``dispatch_burst`` and ``hour_top`` to report CPU per dispatched row of
each part (engine nodes, broker, PostgreSQL, the no-op consumer, the load test
itself) over the same window. Two cores are shared by all of them, so this is
the figure that says which part to make cheaper.

Roles are found by process id where the caller started the process, else by
command line: the broker is the tansu process listening on ``broker_port`` or
the Apache Kafka JVM (``kafka.Kafka``; a benchmark runs alone, so there is one);
PostgreSQL is every process of the postmaster serving ``database`` (its
backends and its background workers: WAL writer, checkpointer, autovacuum),
with what the postmaster's exited children used (it reaps them). Other
processes that exit during the window take their CPU with them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

_TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> list[tuple[int, int, str, float]]:
    """(pid, ppid, command line, CPU seconds) of every readable process."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        # utime + stime, and cutime + cstime: the CPU of children it has reaped. A postmaster reaps every
        # backend and worker that exits, so its total never drops when one exits inside the window.
        used = sum(int(f) for f in fields[11:15]) / _TICK
        found.append((int(name), int(fields[1]), cmd, used))
    return found


def cpu_seconds(pids: Mapping[str, Sequence[int]], bootstrap: str, database_url: str) -> dict[str, float]:
    """CPU seconds used so far by each role: the ``pids`` given per role, ``broker`` (at ``bootstrap``)
    and ``postgres`` (serving ``database_url``'s database) found as the module docstring says, and
    ``load_test`` (this process)."""
    broker_port = bootstrap.rsplit(":", 1)[-1]
    # The URL's path, not its last '/': an embedded server's URL ends in ?host=/.../postgres.
    database = urlsplit(database_url).path.lstrip("/")
    processes = _processes()
    totals = {role: 0.0 for role in pids} | {"broker": 0.0, "postgres": 0.0, "load_test": 0.0}
    role_of = {pid: role for role, members in pids.items() for pid in members}
    # A backend's title is "postgres: <user> <database> <client> <state>".
    postmasters = {
        ppid for _pid, ppid, cmd, _used in processes if cmd.startswith("postgres:") and f" {database} " in cmd
    }
    for pid, ppid, cmd, used in processes:
        if pid in role_of:
            totals[role_of[pid]] += used
        elif pid == os.getpid():
            totals["load_test"] += used
        elif ("tansu" in cmd and f":{broker_port}" in cmd) or "kafka.Kafka" in cmd:
            totals["broker"] += used
        elif ppid in postmasters or pid in postmasters:
            totals["postgres"] += used
    return totals


def per_row(before: Mapping[str, float], after: Mapping[str, float], rows: int) -> dict[str, float]:
    """Microseconds of CPU per row of each role between two :func:`cpu_seconds` readings."""
    return {role: round((after[role] - before.get(role, 0.0)) / max(rows, 1) * 1e6, 1) for role in after}
