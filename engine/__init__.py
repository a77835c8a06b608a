"""The chronoq engine: schedules in, durable occurrences and outbox rows out.

Its rooms, by role:

* ``rules/`` — pure decisions, no I/O: cron parsing, the time contract
  (``rules/timing/``), the occurrence state machine, the schedule lifecycle,
  retry and overlap decisions, shards. A contract test keeps I/O libraries out.
* ``control/`` — the control plane: a raw request becomes a validated
  ``ScheduleRequest`` in ``schedule_requests``; ``schedules`` stores and reads
  schedules (``ControlPlane``); tenants, quotas, dead letters, pagination, the
  JSON views, and the processor of signed Kafka commands.
* ``loops/`` — the background loops (materializer, attempt processor and its
  ledger, lease reaper, overlap gate) and ``service``, which runs the ones a
  process's roles select.
* ``api/`` — the HTTP API (plain ASGI), its OpenAPI document and server.
* ``cli/`` — the ``chronoq`` command, endpoint resolution from the environment,
  log format, and the embedded PostgreSQL + broker (``cli/embedded/``) that only
  the CLI and the tests start.
* ``client.py`` — the client services use: HTTP API and signed commands.

The relay (``relay/``) and consumer runtime (``consumers/``) are packages of
their own that never import the engine; ``schemas/`` is the contract they share.
"""
