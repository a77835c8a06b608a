"""The `chronoq` command as a user runs it, in subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import orjson
import psutil
import pytest

from engine.cli.embedded.apache_kafka import java_binary
from engine.cli.embedded.brokers import BROKER_KINDS, BROKER_NAMES
from engine.loops.service import run_services
from schemas.errors import StackError
from tests.support.brokers import require_apache_kafka
from tests.support.services import fast_services
from tests.support.waiting import wait_for

CHRONOQ = [sys.executable, "-m", "engine.cli"]
ROOT = Path(__file__).resolve().parents[2]


def cli_env(engine_db: str | None = None, kafka: str | None = None, **extra: str) -> dict[str, str]:
    # Where the Kafka jars are cached is a property of the machine, not of the stack under test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_") or k == "CHRONOQ_KAFKA_JARS"}
    if engine_db:
        env.update(CHRONOQ_DATABASE_URL=engine_db, CHRONOQ_KAFKA_BOOTSTRAP=kafka or "")
    env.update(extra)
    return env


#: The bootstrap of the control commands' tests (schedule, calendar, target, tenant: they write the engine's
#: database and never the broker): an address where no broker listens, so each such test runs once rather
#: than once per broker, and shows that operators can manage schedules while the broker is down.
NO_BROKER = "127.0.0.1:9"


def control_env(engine_db: str) -> dict[str, str]:
    """The environment of a control command on ``engine_db``, with no broker (``NO_BROKER``)."""
    return cli_env(engine_db, NO_BROKER)


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CHRONOQ + args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args, field",
    [
        (["--cron", "0 0 30 2 *"], "expression"),
        (["--cron", "not a cron"], "expression"),
        (["--cron", "0 9 * * *", "--tz", "Europe/Atlantis"], "time_zone"),
        (["--cron", "0 9 * * *", "--payload", "{not json"], "payload"),
        (["--cron", "0 9 * * *", "--payload", '{"order": 123456789012345678901234567890}'], "payload"),
        (["--at", "2026-13-01T00:00:00Z"], "expression"),
        (["--cron", "0 9 * * *", "--at", "2030-01-01T00:00:00Z"], "expression"),
        ([], "expression"),
    ],
)
async def test_bad_input_exits_non_zero_with_one_line_naming_the_field_and_writes_nothing(
    engine_db, pool, args, field, acme
):
    result = await asyncio.to_thread(
        run,
        ["schedule", "create", "--tenant", "acme", "--target", "billing.invoice", *args],
        control_env(engine_db),
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f": {field}: " in lines[0], result.stderr
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 0


def test_engine_help_says_what_runs_and_what_runs_elsewhere():
    result = run(["engine", "--help"], cli_env())
    assert result.returncode == 0
    for role in ("materializer", "attempts", "reaper", "overlap-gate", "commands"):
        assert f"  {role} " in result.stdout, result.stdout
    assert "chronoq relay" in result.stdout and "chronoq api" in result.stdout


async def test_missing_target_is_named(engine_db, acme):
    result = await asyncio.to_thread(
        run, ["schedule", "create", "--tenant", "acme", "--cron", "0 9 * * *"], control_env(engine_db)
    )
    assert result.returncode == 2 and "target: " in result.stderr


async def test_tenant_usage_of_an_unknown_tenant_says_how_to_create_it(engine_db, acme):
    env = control_env(engine_db)
    result = await asyncio.to_thread(run, ["tenant", "usage", "nobody"], env)
    assert result.returncode != 0 and "chronoq tenant create" in result.stderr, result.stderr
    recount = await asyncio.to_thread(run, ["tenant", "usage", "acme", "--recount", "--json"], env)
    assert recount.returncode == 0, recount.stderr
    assert orjson.loads(recount.stdout)["drift"] == {"schedules": 0, "fires_per_minute": 0.0, "open_occurrences": 0}
    every = await asyncio.to_thread(run, ["tenant", "usage", "--json"], env)
    assert every.returncode == 0, every.stderr
    assert [t["tenant_id"] for t in orjson.loads(every.stdout)] == ["acme"]
    unnamed = await asyncio.to_thread(run, ["tenant", "usage", "--recount"], env)
    assert unnamed.returncode == 2 and "--recount: name the tenant" in unnamed.stderr, unnamed.stderr


async def test_tenant_usage_drift_names_the_tenants_whose_open_counter_a_restore_left_behind(engine_db, acme):
    env = control_env(engine_db)
    clean = await asyncio.to_thread(run, ["tenant", "usage", "--drift", "--json"], env)
    assert clean.returncode == 0 and orjson.loads(clean.stdout) == {"open_occurrences_drift": []}, clean.stderr
    conn = await asyncpg.connect(engine_db)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")  # a restore's --disable-triggers
            await conn.execute(
                "INSERT INTO occurrences (occurrence_id, schedule_id, schedule_version, tenant_id, target,"
                " scheduled_for, available_at) SELECT gen_random_uuid(), gen_random_uuid(), 1, 'acme', 'cli.t',"
                " now(), now() FROM generate_series(1, 3)"
            )
    finally:
        await conn.close()
    drifted = await asyncio.to_thread(run, ["tenant", "usage", "--drift", "--json"], env)
    assert drifted.returncode == 1, drifted.stderr
    assert orjson.loads(drifted.stdout) == {
        "open_occurrences_drift": [
            {"tenant_id": "acme", "counter": 0, "counted": 3, "repair": "chronoq tenant usage acme --recount"}
        ]
    }
    repaired = await asyncio.to_thread(run, ["tenant", "usage", "acme", "--recount", "--json"], env)
    assert orjson.loads(repaired.stdout)["drift"]["open_occurrences"] == 3, repaired.stderr
    assert (await asyncio.to_thread(run, ["tenant", "usage", "--drift"], env)).returncode == 0
    named = await asyncio.to_thread(run, ["tenant", "usage", "acme", "--drift"], env)
    assert named.returncode == 2 and "--drift: checks every tenant" in named.stderr, named.stderr


def test_commands_explain_how_to_find_a_stack(tmp_path):
    result = run(
        ["schedule", "create", "--tenant", "acme", "--target", "x", "--cron", "0 9 * * *"],
        cli_env(CHRONOQ_HOME=str(tmp_path)),
    )
    assert result.returncode == 1 and "chronoq up" in result.stderr


async def test_create_then_consume_prints_the_occurrence_once(engine_db, kafka_bootstrap, consumer_db, target, acme):
    env = cli_env(engine_db, kafka_bootstrap, CHRONOQ_CONSUMER_DATABASE_URL=consumer_db)
    at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    created = await asyncio.to_thread(
        run,
        ["schedule", "create", "--tenant", "acme", "--target", target, "--at", at, "--payload", '{"n": 1}', "--json"],
        env,
    )
    assert created.returncode == 0, created.stderr
    schedule = orjson.loads(created.stdout)
    assert schedule["version"] == 1 and schedule["next_run_at"] and schedule["state"] == "active"

    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, kafka_bootstrap, stop, fast_services()))
    try:
        consumed = await asyncio.to_thread(
            run, ["consume", "--target", target, "--group", "cli-test", "--max", "1", "--json"], env, 60
        )
    finally:
        stop.set()
        await services
    assert consumed.returncode == 0, consumed.stderr
    (line,) = consumed.stdout.strip().splitlines()
    printed = orjson.loads(line)
    assert printed["schedule_id"] == schedule["schedule_id"] and printed["tenant_id"] == "acme"
    assert printed["scheduled_for"] == schedule["next_run_at"]
    assert set(printed) >= {"occurrence_id", "schedule_id", "tenant_id", "scheduled_for", "received_at"}


def _wait_for_file(path: Path, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"chronoq up exited early: {process.stdout.read() if process.stdout else ''}")
        if time.monotonic() > deadline:
            raise AssertionError("chronoq up did not write its state file")
        time.sleep(0.1)


@pytest.mark.parametrize("kafka", BROKER_KINDS)
def test_up_serves_create_and_consume_then_sigterm_leaves_no_process(tmp_path, kafka):
    # The README's example on `chronoq up --kafka tansu|apache`; with apache the broker pid is the JVM's.
    if kafka == "apache":
        require_apache_kafka()
    env = cli_env(CHRONOQ_HOME=str(tmp_path / "home"))
    up = subprocess.Popen(
        CHRONOQ + ["up", "--api-port", "0", "--kafka", kafka],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        state_file = tmp_path / "home" / "stack.json"
        _wait_for_file(state_file, up, 60)
        state = orjson.loads(state_file.read_bytes())
        children = [state["postgres_pid"], state["kafka_pid"]]
        assert all(psutil.pid_exists(pid) for pid in children)

        tenant = run(["tenant", "create", "acme", "--max-active-schedules", "5", "--json"], env)
        assert tenant.returncode == 0, tenant.stderr
        secrets = orjson.loads(tenant.stdout)
        assert secrets["tenant_id"] == "acme" and secrets["api_token"].startswith("cq_")
        assert len(bytes.fromhex(secrets["signing_key"])) == 32
        assert secrets["quotas"]["max_active_schedules"] == 5

        at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
        created = run(["schedule", "create", "--tenant", "acme", "--target", "up.test", "--at", at, "--json"], env)
        assert created.returncode == 0, created.stderr
        consumed = run(["consume", "--target", "up.test", "--max", "1", "--json"], env, 60)
        assert consumed.returncode == 0, consumed.stderr
        printed = orjson.loads(consumed.stdout.strip())
        assert printed["schedule_id"] == orjson.loads(created.stdout)["schedule_id"]
        lag = datetime.fromisoformat(printed["received_at"]) - datetime.fromisoformat(printed["scheduled_for"])
        # Delivered at its time, not a materializer horizon or a retry later (speed itself is the benchmarks'
        # job: on a loaded machine this run alone has seen 10 s).
        assert lag < timedelta(seconds=30)
        usage = run(["tenant", "usage", "acme", "--json"], env)
        assert usage.returncode == 0, usage.stderr
        # The one-time schedule ran, so it is completed and no longer counts against the quota.
        printed = orjson.loads(usage.stdout)
        assert printed["usage"] == {"schedules": 0, "fires_per_minute": 0.0, "open_occurrences": 0}
        assert printed["quotas"]["max_active_schedules"] == 5
    finally:
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=60)
    assert up.returncode == 0, output
    assert "database:" in output and f"({BROKER_NAMES[kafka]})" in output
    for pid in children:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not state_file.exists()


def test_up_with_apache_kafka_but_no_jars_says_how_to_fetch_them_and_starts_nothing(tmp_path):
    try:
        java_binary()
    except StackError as err:
        pytest.skip(f"the message would be about java first: {err}")
    env = cli_env(CHRONOQ_HOME=str(tmp_path / "home"), CHRONOQ_KAFKA_JARS=str(tmp_path / "no-jars"))
    result = run(["up", "--api-port", "0", "--kafka", "apache"], env)
    assert result.returncode == 1
    assert "`chronoq kafka fetch`" in result.stderr and str(tmp_path / "no-jars") in result.stderr
    assert not (tmp_path / "home" / "postgres").exists()  # PostgreSQL was not started either


def test_preview_skips_the_nonexistent_spring_forward_time():
    result = run(
        [
            "schedule",
            "preview",
            "--cron",
            "30 2 * * *",
            "--tz",
            "America/New_York",
            "--from",
            "2026-03-07T00:00:00Z",
            "-n",
            "3",
            "--json",
        ],
        cli_env(),
    )
    assert result.returncode == 0, result.stderr
    fires = orjson.loads(result.stdout)["fires"]
    assert [f["utc"] for f in fires] == ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
    assert not any(f["local"].startswith("2026-03-08") for f in fires)
    assert fires[1]["local"] == "2026-03-09T02:30:00-04:00"


@pytest.mark.parametrize(
    "repeat, expected",
    [
        ([], ["2026-11-01T05:30:00Z"]),
        (["--dst-repeat", "both"], ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]),
    ],
)
def test_preview_fires_a_repeated_wall_time_once_by_default(repeat, expected):
    result = run(
        [
            "schedule",
            "preview",
            "--cron",
            "30 1 * * *",
            "--tz",
            "America/New_York",
            "--from",
            "2026-10-31T12:00:00Z",
            "-n",
            "4",
            "--json",
            *repeat,
        ],
        cli_env(),
    )
    assert result.returncode == 0, result.stderr
    fires = orjson.loads(result.stdout)["fires"]
    assert [f["utc"] for f in fires if f["local"].startswith("2026-11-01")] == expected


def test_preview_names_the_rule_and_excludes_an_ics_files_dates_offline():
    ics = ROOT / "tests" / "unit" / "calendars" / "holidays_berlin_2026.ics"
    result = run(
        [
            "schedule",
            "preview",
            "--cron",
            "0 9 * * TUE#2",
            "--tz",
            "Europe/Berlin",
            "--from",
            "2026-12-01T00:00:00Z",
            "-n",
            "2",
            "--exclude-ics",
            str(ics),
        ],
        cli_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [
        "2026-12-08T08:00:00Z  2026-12-08T09:00:00+01:00  day-of-week TUE#2: second Tuesday of the month",
        "2027-01-12T08:00:00Z  2027-01-12T09:00:00+01:00  day-of-week TUE#2: second Tuesday of the month",
    ]
    # The text lists the calendar's entries in the window (none of them a second Tuesday).
    assert "excluded dates in this window:" in result.stdout and "2026-12-24/2027-01-01" in result.stdout


async def test_calendars_from_the_cli_with_tenant_isolation(engine_db, acme, pool):
    from engine.control.tenants import create_tenant

    await create_tenant(pool, "globex")
    env = control_env(engine_db)
    ics = ROOT / "tests" / "unit" / "calendars" / "holidays_berlin_2026.ics"

    async def chronoq(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(run, [*args], env)

    imported = await chronoq(
        "calendar", "import", "berlin", str(ics), "--tenant", "acme", "--tz", "Europe/Berlin", "--json"
    )
    assert imported.returncode == 0, imported.stderr
    assert orjson.loads(imported.stdout)["imported"]["entries"] == 5
    created = await chronoq(
        "calendar",
        "create",
        "closures",
        "--tenant",
        "acme",
        "--date",
        "2026-12-07",
        "--date",
        "2026-12-14/2026-12-15",
        "--json",
    )
    assert orjson.loads(created.stdout)["date_count"] == 2
    schedule = await chronoq(
        "schedule",
        "create",
        "--tenant",
        "acme",
        "--target",
        "ops",
        "--cron",
        "0 9 * * MON-FRI",
        "--tz",
        "Europe/Berlin",
        "--calendar",
        "closures",
        "--max-runs",
        "30",
        "--json",
    )
    assert schedule.returncode == 0, schedule.stderr
    sid = orjson.loads(schedule.stdout)["schedule_id"]
    upcoming = await chronoq(
        "schedule", "upcoming", sid, "--tenant", "acme", "-n", "3", "--from", "2026-12-06T00:00:00Z", "--json"
    )
    assert [f["local"][:10] for f in orjson.loads(upcoming.stdout)["fires"]] == [
        "2026-12-08",
        "2026-12-09",
        "2026-12-10",
    ]
    in_use = await chronoq("calendar", "delete", "closures", "--tenant", "acme")
    assert in_use.returncode == 1 and "used by 1 live schedule" in in_use.stderr
    for args in (
        ("calendar", "get", "closures", "--tenant", "globex"),
        (
            "schedule",
            "create",
            "--tenant",
            "globex",
            "--target",
            "ops.globex",  # its own target: acme's "ops" would be refused before the calendar is looked up
            "--cron",
            "0 9 * * *",
            "--calendar",
            "closures",
        ),
    ):
        other = await chronoq(*args)
        assert other.returncode == 1 and "calendar closures not found" in other.stderr, other.stderr
    listed = await chronoq("calendar", "list", "--tenant", "acme", "--json")
    assert [c["name"] for c in orjson.loads(listed.stdout)["items"]] == ["berlin", "closures"]


def test_preview_rejects_an_expression_that_never_fires():
    result = run(["schedule", "preview", "--cron", "0 0 30 2 *"], cli_env())
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "expression: " in result.stderr


async def test_operators_manage_the_lifecycle_from_the_cli(engine_db, acme):
    env = control_env(engine_db)

    async def chronoq(*args: str) -> dict:
        result = await asyncio.to_thread(run, [*args, "--json"], env)
        assert result.returncode == 0, result.stderr
        return orjson.loads(result.stdout)

    created = await chronoq("schedule", "create", "--tenant", "acme", "--target", "ops", "--cron", "0 9 * * *")
    sid = created["schedule_id"]
    updated = await chronoq("schedule", "update", sid, "--tenant", "acme", "--cron", "0 10 * * *", "--tz", "Asia/Tokyo")
    assert (updated["version"], updated["expression"], updated["time_zone"]) == (2, "0 10 * * *", "Asia/Tokyo")
    stale = ["schedule", "update", sid, "--tenant", "acme", "--cron", "0 11 * * *", "--expected-version", "1"]
    refused = await asyncio.to_thread(run, stale, env)
    assert refused.returncode == 1 and "is at version 2, not 1" in refused.stderr
    assert (await chronoq("schedule", "pause", sid, "--tenant", "acme"))["state"] == "paused"
    assert (await chronoq("schedule", "resume", sid, "--tenant", "acme"))["state"] == "active"
    assert (await chronoq("schedule", "cancel", sid, "--tenant", "acme"))["state"] == "canceled"
    listed = await chronoq("schedule", "list", "--tenant", "acme", "--state", "canceled")
    assert [s["schedule_id"] for s in listed["items"]] == [sid]
    history = await chronoq("schedule", "history", sid, "--tenant", "acme")
    assert [h["change"] for h in history] == ["create", "update", "pause", "resume", "cancel"]
    other = await asyncio.to_thread(run, ["schedule", "get", sid, "--tenant", "globex"], env)
    assert other.returncode == 1 and "not found" in other.stderr


async def test_operators_register_grant_and_revoke_targets_from_the_cli(engine_db, pool, acme):
    from engine.control.tenants import create_tenant

    await create_tenant(pool, "globex")
    env = control_env(engine_db)

    async def chronoq(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(run, [*args, "--json"], env)

    registered = await chronoq("target", "register", "billing.invoice", "acme")
    assert registered.returncode == 0, registered.stderr
    assert orjson.loads(registered.stdout) == {
        "target": "billing.invoice",
        "owner": "acme",
        "granted": [],
        "version": 1,
    }
    refused = await chronoq(
        "schedule", "create", "--tenant", "globex", "--target", "billing.invoice", "--cron", "0 9 * * *"
    )
    assert refused.returncode != 0 and "target: 'billing.invoice' belongs to another tenant" in refused.stderr
    granted = orjson.loads((await chronoq("target", "grant", "billing.invoice", "globex")).stdout)
    assert (granted["granted"], granted["version"]) == (["globex"], 2)
    created = await chronoq(
        "schedule", "create", "--tenant", "globex", "--target", "billing.invoice", "--cron", "0 9 * * *"
    )
    assert created.returncode == 0, created.stderr
    still_used = await chronoq("target", "revoke", "billing.invoice", "globex")
    assert still_used.returncode != 0 and "live schedules" in still_used.stderr
    listed = orjson.loads((await chronoq("target", "list", "--tenant", "globex")).stdout)
    assert [t["target"] for t in listed["items"]] == ["billing.invoice"]


async def test_an_operator_registers_the_group_that_reports_a_targets_attempts_from_the_cli(engine_db, pool):
    """`chronoq target owner TARGET GROUP` (issue 11): the owner is stored, a change replaces it, a bad
    group name is refused naming the field."""
    from engine.control.attempt_owners import attempt_owner

    env = control_env(engine_db)
    owner = await asyncio.to_thread(run, ["target", "owner", "billing.invoice", "billing", "--json"], env)
    assert owner.returncode == 0, owner.stderr
    shown = orjson.loads(owner.stdout)
    assert (shown["target"], shown["consumer_group"], shown["registered_by"]) == (
        "billing.invoice",
        "billing",
        "operator",
    )
    moved = await asyncio.to_thread(run, ["target", "owner", "billing.invoice", "billing-v2", "--json"], env)
    assert moved.returncode == 0, moved.stderr
    assert await attempt_owner(pool, "billing.invoice") == "billing-v2"
    bad = await asyncio.to_thread(run, ["target", "owner", "billing.invoice", " ", "--json"], env)
    assert bad.returncode != 0 and "consumer_group" in bad.stderr


async def test_a_consumer_with_its_targets_credential_from_the_cli_is_applied_and_the_token_shown_once(
    engine_db, kafka_bootstrap, consumer_db, target, acme, pool
):
    """issue → CHRONOQ_ATTEMPT_CREDENTIALS → chronoq consume signs its events → the engine applies them
    (the target has a credential, so unsigned ones would be rejected); rotate; list never shows a secret."""
    env = cli_env(engine_db, kafka_bootstrap, CHRONOQ_CONSUMER_DATABASE_URL=consumer_db)
    at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    created = await asyncio.to_thread(
        run, ["schedule", "create", "--tenant", "acme", "--target", target, "--at", at, "--json"], env
    )
    assert created.returncode == 0, created.stderr
    issued = await asyncio.to_thread(run, ["target", "credential", "issue", target, "--json"], env)
    assert issued.returncode == 0, issued.stderr
    credential = orjson.loads(issued.stdout)
    token = credential["token"]
    assert token.startswith("cqa_") and token not in issued.stderr

    bad = await asyncio.to_thread(
        run, ["consume", "--target", target, "--max", "1"], {**env, "CHRONOQ_ATTEMPT_CREDENTIALS": "cqa_oops"}
    )
    assert bad.returncode != 0 and "CHRONOQ_ATTEMPT_CREDENTIALS" in bad.stderr and "cqa_oops" not in bad.stderr

    stop = asyncio.Event()
    services = asyncio.create_task(run_services(engine_db, kafka_bootstrap, stop, fast_services()))
    try:
        consumed = await asyncio.to_thread(
            run,
            ["consume", "--target", target, "--group", "cli-signed", "--max", "1", "--json"],
            {**env, "CHRONOQ_ATTEMPT_CREDENTIALS": f"{target}={token}"},
            60,
        )
        assert consumed.returncode == 0, consumed.stderr
        assert token not in consumed.stdout + consumed.stderr
        await wait_for(lambda: _state_is(pool, target, "SUCCEEDED"), timeout=30)
    finally:
        stop.set()
        await services

    rotated = orjson.loads(
        (
            await asyncio.to_thread(run, ["target", "credential", "rotate", target, "--grace", "10m", "--json"], env)
        ).stdout
    )
    assert rotated["expiring"] == [credential["credential_id"]] and rotated["token"] != token
    listed = await asyncio.to_thread(run, ["target", "credential", "list", target, "--json"], env)
    items = orjson.loads(listed.stdout)["items"]
    assert {i["credential_id"] for i in items} == {credential["credential_id"], rotated["credential_id"]}
    assert "token" not in listed.stdout and token[-64:] not in listed.stdout


async def _state_is(pool, target: str, state: str) -> bool:
    return await pool.fetchval("SELECT state FROM occurrences WHERE target = $1", target) == state
