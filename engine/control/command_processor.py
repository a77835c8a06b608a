"""The command processor: scheduling commands from Kafka, applied once each.

Services produce signed commands to ``chronoq.commands`` (format in
``schemas/commands.py``). For each record the processor:

1. parses it (header values may be null or binary, the value anything) — a
   malformed record is answered ``rejected`` on the shared results topic and
   skipped, it never blocks the partition;
2. verifies the HMAC signature with the claimed tenant's signing key — a
   forged or unsigned command is answered ``rejected`` (on the shared results
   topic, without a tenant) and changes nothing;
   rejected-unauthenticated commands are NOT recorded as processed, so a
   forger cannot burn a legitimate command id;
3. refuses commands older than ``max_age`` (the dedupe window) or issued in
   the future beyond ``max_skew``;
4. in ONE transaction records the (tenant, command id) as processed, applies it
   through the control plane (a savepoint, so a validation error — or a value
   the database refuses — rolls back only the effect), stores the outcome and
   queues the result for the tenant's ``chronoq.command-results.<tenant>`` in
   the outbox. A replayed or redelivered command finds its id recorded and is
   answered with the stored outcome; command ids are scoped by tenant, so
   another tenant's id never matches (it is that tenant's own command);
5. commits the Kafka offset only after those transactions committed (the
   Kafka processor skeleton, :mod:`engine.loops.kafka_processor`, a
   partition's fetched records at a time: a transient database error reads
   them again after a backoff, and replayed commands are answered from their
   stored outcomes). Answers to rejected records are written together, so a
   flood of them costs one commit per fetch, not one per record.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
from aiokafka.structs import ConsumerRecord
from opentelemetry import metrics

from engine.control.schedules import ControlPlane
from engine.control.tenants import find_tenant
from engine.loops.kafka_processor import KafkaLoopSettings, KafkaProcessorLoop, database_scoped_group
from engine.loops.reporting import SUMMARY_EVERY
from schemas import observability as obs
from schemas.commands import (
    Command,
    CommandResult,
    decode_command,
    signature_of,
    signature_valid,
)
from schemas.error_classification import is_transient
from schemas.errors import ChronoqError, MalformedMessage
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.queries import QUERIES
from schemas.topics import COMMAND_RESULTS_TOPIC, COMMANDS_TOPIC, command_results_topic

log = logging.getLogger("chronoq.commands")

# Ids for records too broken to carry one: stable per (topic, partition, offset).
_MALFORMED_NAMESPACE = uuid.UUID("1c4f7a52-3e55-4f0e-9d9e-636d6472656a")


@dataclass(frozen=True)
class CommandConfig:
    """group: the engine's consumer group on chronoq.commands. Default:
        ``chronoq-engine-commands.<engine database name>``: the engines of one
        database share the commands, engines of different databases on one
        broker (staging, tests) never take each other's.
    max_age: commands issued longer ago are refused (the dedupe window).
    max_skew: commands issued further in the future are refused (clock skew).
    session_timeout / heartbeat_interval: group membership timing (s).
    """

    group: str | None = None
    max_age: timedelta = timedelta(days=7)
    max_skew: timedelta = timedelta(minutes=5)
    session_timeout: float = 10.0
    heartbeat_interval: float = 3.0


def _error(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, **({"field": field} if field else {})}


def _refusal(err: BaseException) -> dict[str, Any]:
    """The answer to a command the database refused for its content (or that failed on a bug)."""
    sqlstate = getattr(err, "sqlstate", None)
    if isinstance(sqlstate, str):
        return _error(
            "invalid_input",
            f"the database refused a value of this command (SQLSTATE {sqlstate}:"
            f" {str(err)[:200]}); check its strings and sizes",
        )
    return _error("internal_error", "the engine could not apply this command; it was not applied")


def _error_of(err: ChronoqError) -> dict[str, Any]:
    """A rejected command's error, with the same code and field the HTTP API would answer."""
    return _error(err.code, str(err), err.field)


class CommandProcessor:
    def __init__(
        self,
        pool: asyncpg.Pool,
        kafka_bootstrap: str,
        control: ControlPlane,
        config: CommandConfig | None = None,
        meter: metrics.Meter | None = None,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.pool = pool
        self.kafka_bootstrap = kafka_bootstrap
        self.security = security
        self.control = control
        self.config = config or CommandConfig()
        meter = meter or obs.get_meter("engine")
        self._processed = meter.create_counter(obs.COMMANDS_PROCESSED, unit="1")

    async def process(self, record: ConsumerRecord) -> CommandResult:
        """Apply one command record at most once and queue its result; return the result.

        Whatever the record holds, it is answered: a record that cannot be a
        command, or whose content the database refuses, is answered
        ``rejected`` — never retried, never blocking the partition. Only a
        transient error (the database unavailable, ``is_transient``) raises:
        the loop reads the record again later.
        """
        verdict = await self._evaluate(record)
        if isinstance(verdict, CommandResult):
            await self._answer([verdict])
            return verdict
        return await self._apply_checked(verdict)

    async def _evaluate(self, record: ConsumerRecord) -> CommandResult | Command:
        """The command to apply, or the rejection to answer without applying anything."""
        try:
            command = decode_command(record.value)
            signature = signature_of(record.headers)
        except MalformedMessage as err:
            command_id = uuid.uuid5(_MALFORMED_NAMESPACE, f"{record.topic}/{record.partition}/{record.offset}")
            return CommandResult(command_id, None, "rejected", error=_error("malformed", str(err), err.field))
        tenant = await find_tenant(self.pool, command.tenant_id)
        if (
            tenant is None
            or tenant.state != "active"
            or not signature_valid(tenant.signing_key, record.value, signature)
        ):
            # Same answer whether the tenant exists or not: nothing to probe. It goes to the shared results
            # topic without a tenant: nobody proved to be that tenant.
            return CommandResult(
                command.command_id,
                None,
                "rejected",
                error=_error(
                    "unauthorized", "the signature is missing or does not verify with the tenant's signing key"
                ),
            )
        now = await self.control.now()
        if now - command.issued_at > self.config.max_age or command.issued_at - now > self.config.max_skew:
            return CommandResult(
                command.command_id,
                command.tenant_id,
                "rejected",
                error=_error(
                    "stale",
                    f"issued_at {command.issued_at.isoformat()} is outside the accepted window"
                    f" ({self.config.max_age} back, {self.config.max_skew} ahead); send a new command",
                ),
            )
        return command

    async def _apply_checked(self, command: Command) -> CommandResult:
        """Apply an authenticated, timely command; a non-transient failure is still answered."""
        try:
            return await self._apply_once(command)
        except Exception as err:
            if is_transient(err):
                raise
            # Refused outside the effect's savepoint (recording the outcome, queueing the result): answer anyway.
            log.exception(
                "command could not be applied; answered rejected",
                extra={
                    "action": "command.refused",
                    "command_id": str(command.command_id),
                    "tenant_id": command.tenant_id,
                    "error": repr(err),
                },
            )
            refused = CommandResult(command.command_id, command.tenant_id, "rejected", error=_refusal(err))
            await self._answer([refused])
            return refused

    async def _apply_once(self, command: Command) -> CommandResult:
        clock_now = self.control.clock.now()
        tenant_id, command_id = command.tenant_id, command.command_id
        async with self.pool.acquire() as conn, conn.transaction():
            fresh = await conn.fetchval(
                *QUERIES.claim_command(command_id=command_id, tenant_id=tenant_id, action=command.action, now=clock_now)
            )
            if fresh is None:
                stored = await conn.fetchrow(*QUERIES.command_outcome(tenant_id=tenant_id, command_id=command_id))
                outcome = stored["outcome"]
                result = CommandResult(
                    command_id,
                    tenant_id,
                    outcome.get("status", "rejected"),
                    outcome.get("schedule"),
                    outcome.get("error"),
                )
            else:
                try:
                    schedule = await self._apply(command, conn)
                    result = CommandResult(command_id, tenant_id, "applied", schedule)
                except ChronoqError as err:
                    result = CommandResult(command_id, tenant_id, "rejected", error=_error_of(err))
                except Exception as err:
                    if is_transient(err):
                        raise
                    # The effect's savepoint rolled back; what the database refused is the command's fault
                    # (SQLSTATE class 22, a check violation...): recorded as its rejection, answered once.
                    log.exception(
                        "command refused by the database; recorded as rejected",
                        extra={
                            "action": "command.refused",
                            "command_id": str(command_id),
                            "tenant_id": tenant_id,
                            "error": repr(err),
                        },
                    )
                    result = CommandResult(command_id, tenant_id, "rejected", error=_refusal(err))
                await conn.execute(
                    *QUERIES.record_command_outcome(
                        tenant_id=tenant_id, command_id=command_id, outcome=result.to_json()
                    )
                )
            await self._queue_result(conn, result)
        self._processed.add(1, {"status": result.status, "action": command.action})
        log.info(
            "command processed",
            extra={
                "action": "command." + result.status,
                "command_id": str(command_id),
                "tenant_id": tenant_id,
                "command": command.action,
                "replayed": fresh is None,
            },
        )
        return result

    async def _apply(self, command: Command, conn: asyncpg.Connection) -> dict[str, Any]:
        control, tenant = self.control, command.tenant_id
        if command.action == "create":
            key = command.idempotency_key or f"command:{command.command_id}"
            return await control.create_schedule(tenant, command.body or {}, key, conn=conn)
        assert command.schedule_id is not None
        if command.action == "update":
            return await control.update_schedule(tenant, command.schedule_id, command.body or {}, conn=conn)
        change = {
            "pause": control.pause_schedule,
            "resume": control.resume_schedule,
            "cancel": control.cancel_schedule,
        }[command.action]
        return await change(tenant, command.schedule_id, conn=conn)

    async def _answer(self, results: list[CommandResult]) -> None:
        """Queue the answers to rejected records, in one transaction (a flood of them costs one commit)."""
        if not results:
            return
        async with self.pool.acquire() as conn, conn.transaction():
            for result in results:
                await self._queue_result(conn, result)
        for result in results:
            self._processed.add(1, {"status": result.status, "action": "unknown"})
            log.warning(
                "command rejected",
                extra={
                    "action": "command.rejected",
                    "command_id": str(result.command_id),
                    "reason": (result.error or {}).get("code"),
                },
            )

    async def _queue_result(self, conn: asyncpg.Connection, result: CommandResult) -> None:
        """Queue the result on its tenant's results topic (the shared one when no tenant was proven)."""
        await conn.execute(
            *QUERIES.insert_topic_message(
                tenant_id=result.tenant_id or "",
                topic=command_results_topic(result.tenant_id),
                message_key=str(result.command_id).encode(),
                message=result.encode(),
                now=self.control.clock.now(),
            )
        )

    async def handle_records(self, records: Sequence[ConsumerRecord]) -> dict[str, int]:
        """The Kafka skeleton's unit: a partition's fetched records, in order.

        Each command is applied in its own transaction; the answers to records
        rejected without applying anything (malformed, unauthorized, stale) are
        queued together, in one transaction before the next command is applied
        and at the end, so a flood of hostile records costs one commit per batch,
        not one per record. A crash in between re-reads the batch: the commands
        are answered from their stored outcomes, the rejections again.
        """
        counts: Counter[str] = Counter()
        rejections: list[CommandResult] = []
        for record in records:
            verdict = await self._evaluate(record)
            if isinstance(verdict, CommandResult):
                rejections.append(verdict)
                counts["rejected"] += 1
                continue
            await self._answer(rejections)
            rejections = []
            counts[(await self._apply_checked(verdict)).status] += 1
        await self._answer(rejections)
        return dict(counts)

    async def run(self, stop: asyncio.Event, summary_every: float = SUMMARY_EVERY) -> None:
        """Consume chronoq.commands until ``stop``; offsets follow the database commits."""
        cfg = self.config
        group = cfg.group or await database_scoped_group("chronoq-engine-commands", self.pool, stop, 1.0, log)
        if group is None:
            return
        settings = KafkaLoopSettings(
            group,
            COMMANDS_TOPIC,
            (COMMANDS_TOPIC, COMMAND_RESULTS_TOPIC),
            cfg.session_timeout,
            cfg.heartbeat_interval,
            summary_every=summary_every,
        )
        await KafkaProcessorLoop(
            "commands", self.kafka_bootstrap, settings, self.handle_records, log, unit="batch", security=self.security
        ).run(stop)
