"""How much memory the embedded PostgreSQL takes for its buffer cache: sized to the machine, not to
PostgreSQL's built-in 128 MB.

A burst's working set outgrows 128 MB quickly: 300,000 occurrences through the consumer side touch the
occurrences, attempts and dedupe tables and their indexes, and 500,000 hour-top schedules come with two
million background ones. With 128 MB every statement of the attempt processor and the consumer apps
reads back pages PostgreSQL evicted moments before (a copy from the OS cache each, and a write of the
dirty page first). Measured on the two-core development machine: 500,000 occurrences through batch
consumer apps cost PostgreSQL 385 µs of CPU per occurrence with 128 MB against 277 µs with this rule's
3 GB, and the whole hour-top pipeline's handler-start p99 fell from 309 s to 252 s
(docs/benchmarks.md, "Shared buffers sized to the machine").

The rule is a conservative share of memory, as for a database that shares its machine with the broker
and the engine: an eighth of the memory this process may use (the cgroup limit when one is set, so a
container's limit is respected, not the host's RAM), at least PostgreSQL's own 128 MB and at most 4 GB.
``CHRONOQ_PG_SHARED_BUFFERS`` (PostgreSQL's syntax: ``512MB``, ``2GB``) overrides it. The value is set
when a data directory starts without one (``EmbeddedPostgres.start``); a value set there later with
``ALTER SYSTEM`` is kept. Pure arithmetic here; reading the machine is :func:`memory_limit`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from schemas.errors import StackError

MB = 1024 * 1024
FLOOR_MB = 128  # PostgreSQL's default: never less
CEILING_MB = 4096
SHARE = 8  # an eighth of memory

OVERRIDE_VARIABLE = "CHRONOQ_PG_SHARED_BUFFERS"
_SETTING = re.compile(r"^[1-9][0-9]*(kB|MB|GB|TB)$")

# cgroup v2, then v1: the memory a container may use.
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def shared_buffers_for(memory_bytes: int) -> str:
    """``shared_buffers`` for a machine (or container) with ``memory_bytes`` of memory: an eighth of it in
    whole megabytes, never below 128 MB nor above 4 GB."""
    megabytes = max(FLOOR_MB, min(CEILING_MB, memory_bytes // SHARE // MB))
    return f"{megabytes}MB"


def memory_limit(cgroup_files: tuple[Path, ...] = _CGROUP_LIMITS) -> int:
    """The memory this process may use: physical memory, or the cgroup's limit when that is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in cgroup_files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) means no limit; v1 writes a huge number instead
            return min(physical, int(text))
    return physical


def embedded_server_settings(
    environ: Mapping[str, str] = os.environ, memory_bytes: int | None = None
) -> dict[str, str]:
    """The server parameters the embedded PostgreSQL starts with, unless its data directory sets them already
    (``memory_bytes``: the machine's, read when None)."""
    override = environ.get(OVERRIDE_VARIABLE, "").strip()
    if override:
        if not _SETTING.match(override):
            raise StackError(
                f"{OVERRIDE_VARIABLE}={override!r} is not a size PostgreSQL understands: give a whole number with"
                " a unit, e.g. 512MB or 2GB"
            )
        return {"shared_buffers": override}
    return {"shared_buffers": shared_buffers_for(memory_limit() if memory_bytes is None else memory_bytes)}
