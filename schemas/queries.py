"""Named SQL queries with named parameters, loaded once from ``schemas/queries/*.sql``.

Each query in a file starts with a header and a one-line description::

    -- name: claim_due_outbox
    -- Claims up to :limit due, unsent rows ... under claim token :token.

and runs until the next header. Parameters are written ``:name``; at load
time each distinct name becomes ``$1``, ``$2``... in order of first
appearance (PostgreSQL casts ``::type``, string literals, quoted identifiers
and comments are left alone). Code calls a query by name with keyword
arguments and passes the result to asyncpg::

    await conn.fetch(*QUERIES.claim_due_outbox(now=now, limit=500, token=token, claim_ttl_s=60.0))

A missing or unknown parameter raises :class:`TypeError` at the call, before
anything reaches the database. No SQL is assembled at run time.

Two registries, one per database: :data:`QUERIES` (the engine database: the
engine and the relay; every file except ``consumer.sql``) and
:data:`CONSUMER_QUERIES` (a consumer app's own database). A name is unique
within its registry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)
CONSUMER_FILE = "consumer"


@dataclass(frozen=True)
class Query:
    """One named query: ``sql`` uses ``$n``; ``params`` are the names of ``$1``, ``$2``... in order."""

    name: str
    file: str
    sql: str
    params: tuple[str, ...]

    def __call__(self, **values: Any) -> tuple[Any, ...]:
        """``(sql, *arguments)`` for asyncpg; TypeError naming any missing or unknown parameter."""
        if values.keys() != set(self.params):
            missing = [p for p in self.params if p not in values]
            unknown = sorted(set(values) - set(self.params))
            raise TypeError(
                f"query {self.name} ({self.file}.sql): "
                + "; ".join(
                    part
                    for part in (
                        f"missing {', '.join(missing)}" if missing else "",
                        f"unknown {', '.join(unknown)}" if unknown else "",
                    )
                    if part
                )
                + f" (takes {', '.join(self.params) or 'no parameters'})"
            )
        return (self.sql, *(values[name] for name in self.params))


class QuerySet(Mapping[str, Query]):
    """Queries by name: ``queries["name"]`` or ``queries.name``."""

    def __init__(self, queries: Mapping[str, Query]) -> None:
        self._queries = MappingProxyType(dict(queries))

    def __getitem__(self, name: str) -> Query:
        return self._queries[name]

    def __getattr__(self, name: str) -> Query:
        try:
            return self._queries[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


#: What ``bind_parameters`` must step over whole, leftmost first and in this order (a character none of
#: them starts is copied as it is): a quoted string or identifier (``''`` / ``""`` escape the quote; the
#: closing quote is a group so an unterminated one can be reported), a line or block comment, a
#: dollar-quoted string, a ``::`` cast and, last, a ``:name`` parameter. One compiled scan, because every
#: process parses every query at import: the character-by-character loop it replaced cost 0.1-0.3 s of
#: each CLI command's and each engine, relay and consumer process's start (tests/unit/test_query_binding.py
#: keeps that loop as the oracle of a property test).
_TOKEN = re.compile(
    r"""(?P<quoted>(?P<quote>['"])(?:(?!(?P=quote)).|(?P=quote){2})*(?P<closed>(?P=quote))?)"""
    r"|--[^\n]*"
    r"|/\*(?:.*?\*/|.*)"
    r"|\$(?P<tag>[A-Za-z_]*)\$(?:.*?\$(?P=tag)\$|.*)"
    r"|::"
    r"|:(?P<param>[A-Za-z_][A-Za-z0-9_]*)",
    re.DOTALL,
)


def bind_parameters(text: str) -> tuple[str, tuple[str, ...]]:
    """Rewrite ``:name`` parameters to ``$n``; return the SQL and the names in ``$n`` order.

    Skips string literals ('...', E'...' with '' escapes), quoted identifiers
    ("..."), dollar-quoted strings ($tag$...$tag$), comments (-- and /* */)
    and ``::type`` casts. ValueError on an unterminated quote.
    """
    names: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("param")
        if name is None:
            if match.group("quoted") is not None and match.group("closed") is None:
                raise ValueError(f"unterminated {match.group('quote')} at character {match.start()}")
            return match.group(0)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _TOKEN.sub(replace, text), tuple(names)


def parse_queries(text: str, file: str) -> dict[str, Query]:
    """The queries of one file's text."""
    parts = _HEADER.split(text)
    queries: dict[str, Query] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} defined twice in {file}.sql")
        source = body.strip()
        if not source:
            raise ValueError(f"query {name!r} in {file}.sql is empty")
        if re.search(r"(?<![$\w])\$\d", _code_only(source)):
            raise ValueError(f"query {name!r} in {file}.sql uses a positional $n parameter; name it :like_this")
        sql, params = bind_parameters(source)
        queries[name] = Query(name, file, sql, params)
    return queries


def _code_only(sql: str) -> str:
    """The SQL without comments and literals (for the positional-parameter check)."""
    return re.sub(r"--[^\n]*|'(?:[^']|'')*'", "", sql)


def load_registry(files: list[str]) -> QuerySet:
    """Every query of ``files`` (names without ``.sql``) in one registry; a name may appear once."""
    found: dict[str, Query] = {}
    for file in files:
        text = resources.files("schemas").joinpath("queries", f"{file}.sql").read_text()
        for name, query in parse_queries(text, file).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined in both {found[name].file}.sql and {file}.sql")
            found[name] = query
    return QuerySet(found)


def query_files() -> list[str]:
    """The names of every ``schemas/queries/*.sql`` file, sorted."""
    return sorted(
        entry.name[:-4]
        for entry in resources.files("schemas").joinpath("queries").iterdir()
        if entry.name.endswith(".sql")
    )


#: The engine database's queries (engine and relay).
QUERIES = load_registry([file for file in query_files() if file != CONSUMER_FILE])
#: A consumer app's own database's queries.
CONSUMER_QUERIES = load_registry([CONSUMER_FILE])
