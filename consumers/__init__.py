"""The library a consumer app imports.

    from consumers import ConsumerApp, ConsumerConfig, Occurrence, PermanentError

    app = ConsumerApp(ConsumerConfig(group="billing", kafka_bootstrap=..., database_url=...))

    @app.handler("billing.invoice", timeout=60, concurrency=4, permanent_errors=(InvoiceRejected,))
    async def invoice(occurrence: Occurrence, conn) -> None:
        await conn.execute("INSERT INTO invoices ...")   # same transaction as the dedupe row
        if occurrence.payload.get("plan") is None:
            raise PermanentError("no plan: retrying cannot help")

    @app.handler("billing.usage", batch=500)             # up to 500 per call, one transaction
    async def usage(occurrences: list[Occurrence], conn) -> None:
        await conn.executemany("INSERT INTO usage ...", [...])

    await app.run()     # SIGTERM: finish in-flight handlers, commit, leave; a second SIGTERM aborts

A consumer app needs Kafka and its own PostgreSQL, never the engine's
database. See docs/consumer-runtime.md for the attempt protocol.
"""

from consumers.app import ConsumerApp
from consumers.attempt_runner import BatchHandler, ConsumerHooks, ConsumerStats, Handler, Outcome
from consumers.config import ConsumerConfig
from consumers.errors import FailedOccurrences, OccurrenceCanceled, PermanentError
from consumers.occurrence import Cancellation, Occurrence

__all__ = [
    "BatchHandler",
    "Cancellation",
    "ConsumerApp",
    "ConsumerConfig",
    "ConsumerHooks",
    "ConsumerStats",
    "FailedOccurrences",
    "Handler",
    "Occurrence",
    "OccurrenceCanceled",
    "Outcome",
    "PermanentError",
]
