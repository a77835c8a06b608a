"""Named SQL queries, loaded once from ``schemas/queries/<room>.sql``.

Each query in a file starts with a header::

    -- name: claim_due_outbox
    -- One line saying what the query does and what it guarantees.

and runs until the next header. Runtime code refers to queries by name
(``ENGINE_SQL["claim_due_outbox"]``); no SQL is assembled at run time.
"""

from __future__ import annotations

import re
from importlib import resources
from types import MappingProxyType
from typing import Mapping

_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def load_queries(room: str) -> Mapping[str, str]:
    """Parse ``schemas/queries/<room>.sql`` into an immutable name → SQL mapping."""
    text = resources.files("schemas").joinpath("queries", f"{room}.sql").read_text()
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"query {name!r} defined twice in {room}.sql")
        sql = body.strip()
        if not sql:
            raise ValueError(f"query {name!r} in {room}.sql is empty")
        queries[name] = sql
    return MappingProxyType(queries)
