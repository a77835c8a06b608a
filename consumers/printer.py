"""The built-in consumer behind ``chronoq consume``: print each applied occurrence.

It is an ordinary consumer app (own database, consumer group, dedupe), whose
business effect is one line on stdout per applied occurrence. The line is
written after the dedupe row is inserted and before the transaction commits:
a crash in between can print a line for an effect that is then redelivered
and printed again, the usual at-least-once caveat for effects outside the
database.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

import asyncpg
import orjson

from consumers.app import ConsumerApp, ConsumerConfig
from consumers.occurrence import Occurrence
from schemas.messages import format_instant


def occurrence_line(occurrence: Occurrence) -> dict[str, Any]:
    return {
        "occurrence_id": str(occurrence.occurrence_id),
        "schedule_id": str(occurrence.schedule_id),
        "schedule_version": occurrence.schedule_version,
        "tenant_id": occurrence.tenant_id,
        "target": occurrence.target,
        "scheduled_for": format_instant(occurrence.scheduled_for),
        "received_at": format_instant(occurrence.received_at),
        "attempt": occurrence.attempt,
        "payload": occurrence.payload,
    }


def human_line(occurrence: Occurrence) -> str:
    lag = (occurrence.received_at - occurrence.scheduled_for).total_seconds()
    return (
        f"{format_instant(occurrence.received_at)} applied {occurrence.target}"
        f" occurrence={occurrence.occurrence_id} tenant={occurrence.tenant_id}"
        f" scheduled_for={format_instant(occurrence.scheduled_for)} lag={lag:.3f}s"
    )


def printing_consumer(
    config: ConsumerConfig, target: str | None, as_json: bool, out: TextIO = sys.stdout, **kwargs: Any
) -> ConsumerApp:
    """A ConsumerApp that prints every occurrence of ``target`` (or of every target)."""
    app = ConsumerApp(config, **kwargs)
    render: Callable[[Occurrence], str] = (
        (lambda occ: orjson.dumps(occurrence_line(occ)).decode()) if as_json else human_line
    )

    async def print_occurrence(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        out.write(render(occurrence) + "\n")
        out.flush()

    if target is None:
        app.fallback_handler(print_occurrence)
    else:
        app.handler(target)(print_occurrence)
    return app
