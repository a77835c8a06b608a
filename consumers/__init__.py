"""The library a consumer app imports.

    from consumers import ConsumerApp, ConsumerConfig, Occurrence

    app = ConsumerApp(ConsumerConfig(group="billing", kafka_bootstrap=..., database_url=...))

    @app.handler("billing.invoice")
    async def invoice(occurrence: Occurrence, conn) -> None:
        await conn.execute("INSERT INTO invoices ...")   # same transaction as the dedupe row

    await app.run()

A consumer app needs Kafka and its own PostgreSQL, never the engine's database.
"""

from consumers.app import ConsumerApp, ConsumerConfig, Handler
from consumers.occurrence import Occurrence

__all__ = ["ConsumerApp", "ConsumerConfig", "Handler", "Occurrence"]
