"""The embedded stack: a real PostgreSQL and a real Kafka-protocol broker, for ``chronoq up`` and tests."""
