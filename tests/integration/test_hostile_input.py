"""Issue 10's findings, one regression test each: hostile records and requests against the real stack.

Each test sends what an adversarial client sent (a null header value, 1e20 seconds,
NUL characters, a forged cursor, an instant before the year 1 in UTC, another
tenant's command id or target) and asserts the answer is a clear rejection naming
the field, that the loop that read it is still alive, and that the next valid
record is applied.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from datetime import UTC, datetime

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from consumers import ConsumerApp, ConsumerConfig, Occurrence
from consumers.dead_letters import HEADER_REASON, HEADER_SOURCE_OFFSET
from engine.api.app import Api
from engine.api.server import bind, serve
from engine.client import ApiError, ChronoqClient, CommandProducer, CommandResults
from engine.control.command_processor import CommandConfig, CommandProcessor
from engine.control.schedules import ControlPlane
from engine.control.tenants import create_tenant
from engine.loops.service import PIPELINE_ROLES, Role
from schemas.commands import HEADER_SIGNATURE, Command, sign
from schemas.identity import occurrence_id
from schemas.messages import OccurrenceMessage, ScheduleStateMessage
from schemas.target_bindings import TargetBindingMessage
from schemas.topics import (
    COMMANDS_TOPIC,
    DEAD_LETTER_TOPIC,
    SCHEDULE_STATES_TOPIC,
    TARGET_BINDINGS_TOPIC,
    command_results_topic,
    create_missing_topics,
    occurrence_topic,
)
from tests.support.effect_apps import effect_app, effects_table
from tests.support.kafka import read_topic
from tests.support.services import Running, fast_services, services_running
from tests.support.waiting import wait_for

AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def daily(target: str, **fields) -> dict:
    return {
        "kind": "cron",
        "expression": "0 9 * * *",
        "time_zone": "Europe/Berlin",
        "target": target,
        "payload": {"plan": "pro"},
        **fields,
    }


@pytest.fixture
async def tenants(pool):
    return await create_tenant(pool, "acme"), await create_tenant(pool, "globex")


@pytest.fixture
async def api(pool, clock, tenants):
    sock = bind("127.0.0.1", 0)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(Api(pool, ControlPlane(pool, clock)), sock, stop))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield ChronoqClient(url, tenants[0].api_token), ChronoqClient(url, tenants[1].api_token)
    stop.set()
    await task


async def refused(call) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await call
    return caught.value


# ------------------------------------------------------------------------------------------- HTTP


@pytest.mark.parametrize("name", ["max_lateness", "flexible_window", "retry_base", "retry_cap", "deadline"])
@pytest.mark.parametrize("value", [1e20, -1e20, 10**18])
async def test_a_huge_duration_is_a_422_naming_the_field_not_a_500(api, target, name, value):
    acme, _ = api
    body = daily(target, **{name: value}, **({"priority": "flexible"} if name == "flexible_window" else {}))
    error = await refused(acme.create_schedule(body))
    assert (error.status, error.field) == (422, name)


async def test_a_fractional_deadline_is_refused_not_truncated_to_no_deadline(api, target, pool):
    acme, _ = api
    error = await refused(acme.create_schedule(daily(target, deadline=0.5)))
    assert (error.status, error.field) == (422, "deadline")
    assert "whole" in str(error)
    # Where the engine stores fractions, they are honoured.
    schedule = await acme.create_schedule(daily(target, retry_base=0.25, retry_cap=1.5, deadline=90))
    assert (schedule["retry_base"], schedule["retry_cap"], schedule["deadline"]) == (0.25, 1.5, 90)


@pytest.mark.parametrize(
    "payload, where", [({"note": "a\x00b"}, "note"), ({"k\x00": 1}, "key"), (["ok", ["deep\x00"]], "[1][0]")]
)
async def test_a_nul_in_the_payload_is_a_422_naming_the_payload(api, target, payload, where):
    acme, _ = api
    error = await refused(acme.create_schedule(daily(target, payload=payload)))
    assert (error.status, error.field) == (422, "payload")
    assert "NUL" in str(error) and where in str(error)


@pytest.mark.parametrize(
    "payload, where", [({"order": 10**29}, "['order']"), ([1, [-(2**63) - 1]], "[1][0]"), ({"id": 2**64}, "['id']")]
)
async def test_an_integer_beyond_64_bits_in_the_payload_is_a_422_not_rounded(api, target, pool, payload, where):
    acme, _ = api
    error = await refused(acme.create_schedule(daily(target, payload=payload)))
    assert (error.status, error.field) == (422, "payload")
    assert "64 bits" in str(error) and where in str(error)
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0
    # What fits is stored and given back exactly, up to the edges.
    edges = {"min": -(2**63), "max": 2**64 - 1, "long": "123456789012345678901234567890"}
    schedule = await acme.create_schedule(daily(target, payload=edges))
    assert (await acme.get_schedule(schedule["schedule_id"]))["payload"] == edges


async def test_a_nul_in_a_query_parameter_is_a_422_naming_it(api):
    acme, _ = api
    error = await refused(acme.request("GET", "/v1/schedules?target=%00"))
    assert (error.status, error.field) == (422, "target")


def forged_cursor(value: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        # Fixed ids: the test ids must be the same in every process that collects them (pytest-xdist).
        forged_cursor([1, "7594ed38-39ac-4f9d-ab85-15d51b9e03f6"]),  # the finding: well-formed, wrong types
        forged_cursor(["0001-01-01T00:00:00+01:00", "948410be-8280-440c-92bd-d5d227dfefeb"]),
        forged_cursor(["2026-11-29T10:00:00Z", "not-a-uuid"]),
        forged_cursor({"a": 1}),
        forged_cursor(["2026-11-29T10:00:00Z"]),
        "%%%",
        "A" * 5000,
    ],
)
async def test_a_wrong_cursor_is_a_422_naming_the_cursor_on_every_listing(api, target, cursor):
    acme, _ = api
    sid = (await acme.create_schedule(daily(target)))["schedule_id"]
    for path in ("/v1/schedules", f"/v1/schedules/{sid}/occurrences", "/v1/dead-letters"):
        error = await refused(acme.request("GET", f"{path}?cursor={cursor}"))
        assert (error.status, error.field) == (422, "cursor"), path


@pytest.mark.parametrize("instant", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
async def test_an_extreme_instant_is_a_422_naming_the_field(api, target, instant):
    acme, _ = api
    error = await refused(acme.preview({"kind": "cron", "expression": "0 9 * * *", "from": instant}))
    assert (error.status, error.field) == (422, "from")
    error = await refused(acme.create_schedule(daily(target, start_at=instant)))
    assert (error.status, error.field) == (422, "start_at")


async def test_a_nul_in_the_idempotency_key_is_a_422(api, target, clock, pool):
    acme, _ = api
    control = ControlPlane(pool, clock)
    with pytest.raises(Exception) as caught:
        await control.create_schedule("acme", daily(target), "key\x00")
    assert getattr(caught.value, "field", None) == "Idempotency-Key"


# ------------------------------------------------------------------------------------------- targets


async def test_a_tenant_cannot_schedule_onto_another_tenants_target(api, target, pool):
    acme, globex = api
    await acme.create_schedule(daily(target))  # first use claims the target
    error = await refused(globex.create_schedule(daily(target)))
    assert (error.status, error.code, error.field) == (403, "forbidden", "target")
    assert "belongs to another tenant" in str(error) and "acme" not in str(error)
    own = await globex.create_schedule(daily(f"{target}-globex"))
    error = await refused(globex.update_schedule(own["schedule_id"], {"target": target}))
    assert (error.status, error.field) == (403, "target")
    assert await pool.fetchval("SELECT count(*) FROM schedules WHERE target = $1", target) == 1


async def test_a_granted_tenant_may_use_the_target(api, target, pool, clock):
    from engine.control import targets

    acme, globex = api
    await acme.create_schedule(daily(target))
    granted = await targets.grant(pool, target, "globex", clock)
    assert (granted.owner, granted.granted, granted.version) == ("acme", ("globex",), 2)
    await globex.create_schedule(daily(target))
    with pytest.raises(Exception, match="live schedules"):
        await targets.revoke(pool, target, "globex", clock)


# ------------------------------------------------------------------------------------------- commands


@pytest.fixture
def processor(pool, clock, kafka_bootstrap):
    return CommandProcessor(
        pool, kafka_bootstrap, ControlPlane(pool, clock), CommandConfig(session_timeout=2.0, heartbeat_interval=0.4)
    )


_offsets = iter(range(10**9))


def command_record(value: bytes, headers: list) -> ConsumerRecord:
    return ConsumerRecord(COMMANDS_TOPIC, 0, next(_offsets), 0, 0, b"acme", value, None, 4, len(value), headers)


def signed_value(tenant, action: str = "create", **fields) -> tuple[bytes, str]:
    command = Command(
        fields.pop("command_id", uuid.uuid4()),
        fields.pop("tenant_id", tenant.tenant.tenant_id),
        action,
        fields.pop("issued_at", AT),
        **fields,
    )
    value = command.encode()
    return value, sign(tenant.tenant.signing_key, value)


async def test_a_null_signature_header_is_answered_not_a_crash(processor, tenants):
    acme, _ = tenants
    value, _ = signed_value(acme, body=daily("billing.invoice"))
    result = await processor.process(command_record(value, [(HEADER_SIGNATURE, None)]))
    assert (result.status, result.error["code"]) == ("rejected", "unauthorized")
    result = await processor.process(command_record(value, [(HEADER_SIGNATURE, b"\xff\xfe")]))
    assert (result.status, result.error["code"], result.error["field"]) == ("rejected", "malformed", HEADER_SIGNATURE)


@pytest.mark.parametrize(
    "change, code, field",
    [
        ({"body": daily("t", max_lateness=1e20)}, "invalid_input", "max_lateness"),
        ({"body": daily("t", payload={"x": "\x00"})}, "invalid_input", "payload"),
        ({"body": daily("t", deadline=0.5)}, "invalid_input", "deadline"),
        ({"idempotency_key": "k\x00"}, "malformed", "idempotency_key"),
    ],
)
async def test_hostile_command_content_is_answered_with_the_field(processor, tenants, pool, change, code, field):
    acme, _ = tenants
    value, signature = signed_value(acme, **{"body": daily("billing.invoice"), **change})
    result = await processor.process(command_record(value, [(HEADER_SIGNATURE, signature.encode())]))
    assert (result.status, result.error["code"], result.error.get("field")) == ("rejected", code, field)
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0


async def test_an_integer_beyond_64_bits_in_a_command_is_refused_not_rounded(processor, tenants, pool):
    acme, _ = tenants
    value, _ = signed_value(acme, body=daily("billing.invoice", payload={"order": 1}))
    value = value.replace(b'"order":1', b'"order":123456789012345678901234567890')  # Command.encode refuses it
    signature = sign(acme.tenant.signing_key, value)
    result = await processor.process(command_record(value, [(HEADER_SIGNATURE, signature.encode())]))
    assert (result.status, result.error["code"], result.error.get("field")) == ("rejected", "malformed", "body")
    assert "64 bits" in result.error["message"] and "['payload']['order']" in result.error["message"]
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0


async def test_a_db_refusal_of_a_commands_content_is_a_rejection_not_an_outage(processor, tenants, pool, target):
    """Whatever validation misses, a value the database refuses (SQLSTATE class 22) answers the command."""
    acme, _ = tenants
    await pool.execute("ALTER TABLE schedules ADD CONSTRAINT no_forbidden_plan CHECK (payload->>'plan' <> 'x')")
    value, signature = signed_value(acme, body=daily(target, payload={"plan": "x"}))
    result = await processor.process(command_record(value, [(HEADER_SIGNATURE, signature.encode())]))
    assert (result.status, result.error["code"]) == ("rejected", "invalid_input")
    assert "23514" in result.error["message"]
    assert await pool.fetchval("SELECT outcome->>'status' FROM processed_commands") == "rejected"


async def test_poison_commands_on_the_topic_never_stop_the_loop_or_stall_the_partition(
    processor, tenants, pool, kafka_bootstrap, target
):
    """The findings that stopped `chronoq up` or stalled a partition, sent for real, then a valid command."""
    acme, _ = tenants
    await create_missing_topics(kafka_bootstrap, [COMMANDS_TOPIC])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    stop = asyncio.Event()
    loop_task = asyncio.create_task(processor.run(stop))
    try:
        value, _ = signed_value(acme, body=daily(target))
        nul_tenant = orjson.loads(value)
        nul_tenant["tenant_id"] = "ac\x00me"
        huge = orjson.loads(value)
        huge["body"]["max_lateness"] = 1e20
        bad_instant = orjson.loads(value)
        bad_instant["issued_at"] = "0001-01-01T00:00:00+01:00"
        for poison, headers in [
            (value, [(HEADER_SIGNATURE, None)]),  # null header value
            (orjson.dumps(nul_tenant), [(HEADER_SIGNATURE, b"00")]),  # NUL in the tenant id
            (orjson.dumps(huge), [(HEADER_SIGNATURE, sign(acme.tenant.signing_key, orjson.dumps(huge)).encode())]),
            (orjson.dumps(bad_instant), [(HEADER_SIGNATURE, b"00")]),
            (b"\xff\xfe not json", [(HEADER_SIGNATURE, b"\xff")]),
        ]:
            await producer.send_and_wait(COMMANDS_TOPIC, poison, key=b"acme", headers=headers)
        valid, signature = signed_value(acme, body=daily(target))  # a fresh command id
        await producer.send_and_wait(
            COMMANDS_TOPIC, valid, key=b"acme", headers=[(HEADER_SIGNATURE, signature.encode())]
        )
        await wait_for(lambda: pool.fetchval("SELECT count(*) FROM schedules WHERE target = $1", target), 30)
        assert not loop_task.done()
    finally:
        stop.set()
        await producer.stop()
        await loop_task


async def test_command_ids_are_per_tenant_and_results_never_carry_another_tenants_data(
    processor, tenants, pool, target
):
    acme, globex = tenants
    shared_id = uuid.uuid4()
    value, signature = signed_value(acme, command_id=shared_id, body=daily(target, payload={"secret": "acme"}))
    mine = await processor.process(command_record(value, [(HEADER_SIGNATURE, signature.encode())]))
    value, signature = signed_value(globex, command_id=shared_id, body=daily(f"{target}-g"))
    theirs = await processor.process(command_record(value, [(HEADER_SIGNATURE, signature.encode())]))
    assert (mine.status, theirs.status) == ("applied", "applied")  # globex's command is applied, not answered
    assert theirs.schedule["tenant_id"] == "globex" and "secret" not in orjson.dumps(theirs.schedule).decode()
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 2
    # Each tenant's results go to its own topic; unattributed rejections to the shared one, without a tenant.
    topics = {r["topic"]: r["tenant_id"] for r in await pool.fetch("SELECT topic, tenant_id FROM outbox")}
    assert topics[command_results_topic("acme")] == "acme"
    assert topics[command_results_topic("globex")] == "globex"
    forged = await processor.process(command_record(value, [(HEADER_SIGNATURE, b"00")]))
    assert forged.tenant_id is None


async def test_the_client_reads_only_its_own_tenants_results(engine_db, pool, kafka_bootstrap, tenants, target):
    acme, globex = tenants
    config = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER} | {Role.COMMANDS})
    async with (
        services_running(engine_db, kafka_bootstrap, config),
        CommandResults(kafka_bootstrap, "acme") as acme_results,
        CommandResults(kafka_bootstrap, "globex") as globex_results,
        CommandProducer(kafka_bootstrap, "acme", acme.tenant.signing_key.hex()) as commands,
    ):
        created = await acme_results.wait_for(await commands.send("create", body=daily(target)))
        assert created.status == "applied"
        with pytest.raises(TimeoutError):
            await globex_results.wait_for(created.command_id, timeout=2)


# ------------------------------------------------------------------------------------------- consumers


def occurrence(target: str, tenant: str = "acme") -> OccurrenceMessage:
    schedule_id = uuid.uuid4()
    return OccurrenceMessage(
        occurrence_id(schedule_id, 1, AT), schedule_id, 1, tenant, target, AT, AT, payload={"n": 1}
    )


async def produce(bootstrap: str, records: list[tuple[str, bytes, list]]) -> None:
    # Created first, as chronoq does: Apache Kafka never creates a topic on its own (tansu does).
    await create_missing_topics(bootstrap, sorted({topic for topic, _, _ in records}))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for topic, value, headers in records:
            await producer.send_and_wait(topic, value, key=b"acme", headers=headers)
    finally:
        await producer.stop()


@pytest.fixture
async def effects(consumer_db):
    async with effects_table(consumer_db) as conn:
        yield conn


async def test_an_extreme_instant_on_the_schedule_state_topic_does_not_stop_consumer_apps(
    consumer_db, kafka_bootstrap, target, effects
):
    state = orjson.loads(ScheduleStateMessage(uuid.uuid4(), "acme", 1, "active", AT).encode())
    state["changed_at"] = "0001-01-01T00:00:00+01:00"
    await create_missing_topics(kafka_bootstrap, [SCHEDULE_STATES_TOPIC, occurrence_topic(target)])
    valid = occurrence(target)
    await produce(
        kafka_bootstrap,
        [(SCHEDULE_STATES_TOPIC, orjson.dumps(state), []), (occurrence_topic(target), valid.encode(), [])],
    )
    app = effect_app(consumer_db, kafka_bootstrap, target)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1, 30)
    assert await effects.fetchval("SELECT occurrence_id FROM effects") == valid.occurrence_id


async def test_an_undecodable_occurrence_is_dead_lettered_and_the_offset_moves_on(
    consumer_db, kafka_bootstrap, target, effects
):
    bad = orjson.loads(occurrence(target).encode())
    bad["scheduled_for"] = "0001-01-01T00:00:00+01:00"
    valid = occurrence(target)
    topic = occurrence_topic(target)
    await create_missing_topics(kafka_bootstrap, [topic], partitions=1)
    await produce(
        kafka_bootstrap,
        [(topic, orjson.dumps(bad), [("traceparent", None)]), (topic, valid.encode(), [("chronoq-tenant", None)])],
    )
    app = effect_app(consumer_db, kafka_bootstrap, target)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == 1, 30)
        await wait_for(lambda: app._lanes and all(lane.committed == 2 for lane in app._lanes.values()), 10)
    dead = [
        r for r in await read_topic(kafka_bootstrap, DEAD_LETTER_TOPIC, 0, settle=0.3) if r.value == orjson.dumps(bad)
    ]
    assert len(dead) == 1 and b"scheduled_for" in dict(dead[0].headers)[HEADER_REASON]
    assert dict(dead[0].headers)[HEADER_SOURCE_OFFSET] == b"0"


async def test_a_consumer_app_dead_letters_occurrences_of_tenants_not_bound_to_its_target(
    engine_db, pool, consumer_db, kafka_bootstrap, target, effects, tenants
):
    """acme's schedule binds the target to acme; a globex occurrence on that topic (bypassing the engine,
    as a broker without ACLs allows) is dead-lettered, acme's is applied."""
    control = ControlPlane(pool)
    await control.create_schedule("acme", daily(target))
    config = fast_services(roles=PIPELINE_ROLES - {Role.MATERIALIZER})
    foreign, own = occurrence(target, "globex"), occurrence(target, "acme")
    app = effect_app(consumer_db, kafka_bootstrap, target)
    async with services_running(engine_db, kafka_bootstrap, config):  # the relay announces the binding
        await wait_for(
            lambda: pool.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = 'chronoq.target-bindings' AND sent_at IS NOT NULL"
            ),
            20,
        )
        await produce(
            kafka_bootstrap,
            [(occurrence_topic(target), foreign.encode(), []), (occurrence_topic(target), own.encode(), [])],
        )
        async with Running(app):
            await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == 1, 30)
    assert await effects.fetch("SELECT tenant FROM effects") == [("acme",)]


async def test_an_app_that_names_its_tenants_runs_no_other_tenants_occurrence(
    consumer_db, kafka_bootstrap, target, effects
):
    topic = occurrence_topic(target)
    await create_missing_topics(kafka_bootstrap, [topic])
    await produce(
        kafka_bootstrap,
        [(topic, occurrence(target, "globex").encode(), []), (topic, occurrence(target, "acme").encode(), [])],
    )
    app = effect_app(consumer_db, kafka_bootstrap, target, tenants=frozenset({"acme"}))
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == 1, 30)
    assert await effects.fetch("SELECT tenant FROM effects") == [("acme",)]


async def test_a_record_naming_another_target_than_its_topic_is_dead_lettered(
    consumer_db, kafka_bootstrap, target, effects
):
    app = ConsumerApp(
        ConsumerConfig(
            f"group-{uuid.uuid4().hex[:8]}", kafka_bootstrap, consumer_db, session_timeout=2.0, heartbeat_interval=0.4
        )
    )
    ran: list[str] = []

    @app.handler(target)
    async def first(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        ran.append(occurrence.target)

    @app.handler(f"{target}-other")
    async def second(occurrence: Occurrence, conn: asyncpg.Connection) -> None:
        ran.append(occurrence.target)

    await produce(kafka_bootstrap, [(occurrence_topic(target), occurrence(f"{target}-other").encode(), [])])
    async with Running(app):
        await wait_for(lambda: app.stats.dead_lettered == 1, 30)
    assert ran == []


async def test_hostile_binding_versions_never_crash_the_app_or_hold_the_partition_beyond_the_bound(
    consumer_db, kafka_bootstrap, target, effects
):
    """A binding_version that is no version (negative, zero, beyond PostgreSQL's integer, text, a boolean) is
    dead-lettered at once naming the field; one claiming a version far ahead of the view parks its record
    for binding_behind_timeout only, while the records behind it run, then it is dead-lettered too."""
    topic = occurrence_topic(target)
    await create_missing_topics(kafka_bootstrap, [topic], partitions=1)
    binding = TargetBindingMessage(target, ("acme",), 1, AT)
    await produce(kafka_bootstrap, [(TARGET_BINDINGS_TOPIC, binding.encode(), [])])

    def forged(version: object) -> bytes:
        data = orjson.loads(occurrence(target, "globex").encode())
        data["binding_version"] = version
        return orjson.dumps(data)

    far_ahead = forged(2**31 - 1)
    garbled = [forged(v) for v in (-1, 0, 2**40, "2", True)]
    valid = occurrence(target, "acme")
    await produce(
        kafka_bootstrap,
        [(topic, far_ahead, []), *((topic, value, []) for value in garbled), (topic, valid.encode(), [])],
    )
    app = effect_app(consumer_db, kafka_bootstrap, target, binding_behind_timeout=3.0)
    async with Running(app):
        await wait_for(lambda: app.stats.applied == 1 and app.stats.dead_lettered == len(garbled) + 1, 30)
        await wait_for(lambda: app._lanes and all(lane.committed == 7 for lane in app._lanes.values()), 10)
    ours = {far_ahead, *garbled}  # the dead-letter topic is shared with every other test on this broker
    dead = {
        r.value: dict(r.headers)[HEADER_REASON]
        for r in await read_topic(kafka_bootstrap, DEAD_LETTER_TOPIC, 0, settle=0.3)
        if r.value in ours
    }
    assert all(b"binding_version" in dead[value] for value in garbled)
    assert b"binding view behind" in dead[far_ahead]
    assert await effects.fetch("SELECT tenant FROM effects") == [("acme",)]
