"""Signed scheduling commands: applied once, isolated per tenant, never blocking."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta

import pytest
from aiokafka.structs import ConsumerRecord

from engine.client import CommandProducer, CommandResults
from engine.control.command_processor import CommandProcessor
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.commands import HEADER_SIGNATURE, Command, sign
from schemas.topics import COMMAND_RESULTS_TOPIC
from tests.support.services import fast_services, services_running

DAILY = {"kind": "cron", "expression": "0 9 * * *", "time_zone": "Europe/Berlin", "target": "billing.invoice"}
_offsets = itertools.count()


@pytest.fixture
async def tenants(pool):
    return await create_tenant(pool, "acme"), await create_tenant(pool, "globex")


@pytest.fixture
def processor(pool, clock, kafka_bootstrap):
    return CommandProcessor(pool, kafka_bootstrap, ControlPlane(pool, clock))


def record(value: bytes, signature: str | None) -> ConsumerRecord:
    headers = [(HEADER_SIGNATURE, signature.encode())] if signature is not None else []
    return ConsumerRecord("chronoq.commands", 0, next(_offsets), 0, 0, b"acme", value, None, 4, len(value), headers)


def signed(tenant, clock, action: str, **fields) -> ConsumerRecord:
    command = Command(
        fields.pop("command_id", uuid.uuid4()),
        fields.pop("tenant_id", tenant.tenant.tenant_id),
        action,
        fields.pop("issued_at", clock.now()),
        **fields,
    )
    value = command.encode()
    return record(value, sign(tenant.tenant.signing_key, value))


async def results_in_outbox(pool) -> int:
    """Results queued on the shared results topic and on every tenant's."""
    return await pool.fetchval("SELECT count(*) FROM outbox WHERE topic LIKE $1 || '%'", COMMAND_RESULTS_TOPIC)


async def test_a_command_is_applied_once_even_when_replayed(processor, tenants, clock, pool):
    acme, _ = tenants
    create = signed(acme, clock, "create", body=DAILY)
    first = await processor.process(create)
    replay = await processor.process(create)
    assert first.status == "applied" and first.schedule["version"] == 1
    assert replay == first
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 1
    assert await results_in_outbox(pool) == 2  # the replay is answered again, with the same outcome

    sid = first.schedule["schedule_id"]
    updated = await processor.process(
        signed(acme, clock, "update", schedule_id=uuid.UUID(sid), body={"expression": "0 10 * * *"})
    )
    assert (updated.status, updated.schedule["version"]) == ("applied", 2)
    # A command conditional on the version its sender read is refused once another change came first.
    stale = await processor.process(
        signed(acme, clock, "update", schedule_id=uuid.UUID(sid), body={"payload": 2, "expected_version": 1})
    )
    assert (stale.status, stale.error["code"]) == ("rejected", "conflict")
    assert await pool.fetchval("SELECT version FROM schedules") == 2
    for action, state in (("pause", "paused"), ("resume", "active"), ("cancel", "canceled")):
        result = await processor.process(signed(acme, clock, action, schedule_id=uuid.UUID(sid)))
        assert (result.status, result.schedule["state"]) == ("applied", state)


async def test_invalid_definitions_are_rejected_with_the_field_and_write_nothing(processor, tenants, clock, pool):
    acme, _ = tenants
    result = await processor.process(signed(acme, clock, "create", body={**DAILY, "time_zone": "Nowhere/X"}))
    assert result.status == "rejected" and result.error["field"] == "time_zone"
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0
    # The rejection is recorded: the same command id is answered the same way, not re-applied.
    assert (await pool.fetchval("SELECT outcome->>'status' FROM processed_commands")) == "rejected"


async def test_forged_and_unsigned_commands_change_nothing_and_cannot_burn_a_command_id(
    processor, tenants, clock, pool
):
    acme, globex = tenants
    command_id = uuid.uuid4()
    value = Command(command_id, "acme", "create", clock.now(), body=DAILY).encode()
    forged = await processor.process(record(value, sign(globex.tenant.signing_key, value)))  # globex's key
    unsigned = await processor.process(record(value, None))
    assert forged.status == unsigned.status == "rejected"
    assert forged.error["code"] == "unauthorized"
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0
    legit = await processor.process(signed(acme, clock, "create", command_id=command_id, body=DAILY))
    assert legit.status == "applied"


async def test_a_tenant_cannot_change_another_tenants_schedule_by_command(processor, tenants, clock, pool):
    acme, globex = tenants
    sid = (await processor.process(signed(acme, clock, "create", body=DAILY))).schedule["schedule_id"]
    for action in ("pause", "cancel"):
        result = await processor.process(signed(globex, clock, action, schedule_id=uuid.UUID(sid)))
        assert result.status == "rejected" and result.error["code"] == "not_found"
    result = await processor.process(signed(globex, clock, "update", schedule_id=uuid.UUID(sid), body={"payload": 1}))
    assert result.error["code"] == "not_found"
    assert await pool.fetchval("SELECT version FROM schedules") == 1


@pytest.mark.parametrize(
    "value", [b"\x00 garbage", b"[]", b'{"format": 1, "action": "explode"}', b'{"format": 1, "command_id": "x"}']
)
async def test_malformed_commands_are_answered_and_skipped(processor, tenants, clock, pool, value):
    result = await processor.process(record(value, "00"))
    assert result.status == "rejected" and result.error["code"] == "malformed"
    assert await results_in_outbox(pool) == 1


async def test_stale_commands_are_refused(processor, tenants, clock, pool):
    acme, _ = tenants
    old = await processor.process(signed(acme, clock, "create", body=DAILY, issued_at=clock.now() - timedelta(days=8)))
    future = await processor.process(
        signed(acme, clock, "create", body=DAILY, issued_at=clock.now() + timedelta(hours=1))
    )
    assert old.error["code"] == future.error["code"] == "stale"
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0


async def test_commands_over_kafka_with_results_on_the_results_topic(engine_db, pool, kafka_bootstrap, tenants):
    acme, _ = tenants
    config = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER} | {Role.COMMANDS})
    async with (
        services_running(engine_db, kafka_bootstrap, config),
        CommandResults(kafka_bootstrap, "acme") as results,
        CommandProducer(kafka_bootstrap, "acme", acme.tenant.signing_key.hex()) as commands,
    ):
        garbage_first = await commands.producer.send_and_wait("chronoq.commands", b"not json", key=b"acme")
        assert garbage_first is not None
        created = await results.wait_for(await commands.send("create", body=DAILY, idempotency_key="k"))
        assert created.status == "applied" and created.schedule is not None
        paused = await results.wait_for(await commands.send("pause", schedule_id=created.schedule["schedule_id"]))
        assert paused.schedule is not None and paused.schedule["state"] == "paused"
    assert await pool.fetchval("SELECT state FROM schedules") == "paused"
