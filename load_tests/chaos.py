"""Chaos run: kill, pause and cut the database under every component, then prove nothing was lost or doubled.

    python -m load_tests.chaos [--minutes 5] [--engines 3] [--relays 2] [--consumers 2] [--schedules 300]
                               [--tenants 5] [--batch-consumers 1] [--json PATH] [--seed N]

Runs only the public processes against one PostgreSQL and one broker (the
embedded ones, or CHRONOQ_ADMIN_URL + CHRONOQ_KAFKA_BOOTSTRAP): ``chronoq
engine`` (x3), ``chronoq relay`` (x2), ``chronoq api`` (to create the
schedules) and a consumer app (``load_tests.chaos_consumer``, x2) that writes
one ``chaos_effects`` row per applied effect (no unique key: a double shows);
the last ``--batch-consumers`` of them (default 1) run batch handlers, so one
consumer group holds both runners and both forms of attempt events.
Each process's database connections carry ``application_name=<process>``, so
faults can aim at one process's backends.

For ``--minutes`` it injects, every 1-4 s, one of:

* ``kill``: SIGKILL a process, restart it 0.5-3 s later;
* ``pause``: SIGSTOP a process past its leases (consumers: longer than their
  6 s attempt lease; once per run a relay past its 60 s claims), then SIGCONT;
* ``terminate``: ``pg_terminate_backend`` on a process's backends that are
  ``idle``, ``idle in transaction`` or ``active`` (of processes past their
  first 5 s: ``--start-up-faults`` aims at starting processes too);
* ``claim_mark``: terminate a relay's backend between its claim and its mark
  (its last statement was the claim); ``page_cursor``: the same for an engine
  node's ahead lane, between a page's read and its cursor move;
* ``handler``: terminate a consumer's backend while a handler's transaction
  is open (``idle in transaction`` after the effect's insert);
* ``control``: pause, later resume, a schedule through the API (new versions
  while everything else is failing).

Then it resumes everything, restarts what is down, waits for every occurrence
of the window to reach a final state, runs ``chronoq reconcile`` (with the
consumer database) over the window, checks ``chaos_effects`` for doubled
and missing effects, and compares every tenant's open-occurrence counter (the
tenant gate's, migration 0027) with a count. The report lists every fault
injected, every process that exited on its own, every occurrence not final,
and the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from engine.client import ChronoqClient
from engine.control import targets as target_registry
from engine.control.quotas import open_count_drift
from schemas.clock import DatabaseClock

ROOT = Path(__file__).resolve().parents[1]
CHRONOQ = [sys.executable, "-m", "engine.cli"]
FINAL = ("SUCCEEDED", "DEAD", "MISSED", "CANCELED", "SKIPPED_OVERLAP")
EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    occurrence_id uuid NOT NULL, schedule_id uuid NOT NULL, scheduled_for timestamptz NOT NULL,
    attempt int, worker text, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())
"""


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added (asyncpg passes unknown ones as server settings)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


def database_url(admin_url: str, name: str) -> str:
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@dataclass
class Exit:
    process: str
    at_s: float
    returncode: int | None
    log_tail: str


@dataclass
class Component:
    """One process of the run: how to start it, and what happened to it."""

    name: str
    kind: str  # engine | relay | consumer | api
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: asyncio.subprocess.Process | None = None
    expected_down: bool = False  # we killed it (or are stopping it)
    paused: bool = False
    starts: int = 0
    started_at: float = 0.0  # monotonic instant of the current process's start

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None


@dataclass
class Fault:
    at_s: float
    kind: str
    target: str
    detail: str = ""


@dataclass
class Options:
    minutes: float = 5.0
    engines: int = 3
    relays: int = 2
    consumers: int = 2
    # The last this many consumers run batch handlers (of BATCH_SIZE occurrences), the others single ones.
    batch_consumers: int = 1
    schedules: int = 300
    tenants: int = 5
    targets: int = 4
    stuck_after: str = "20s"
    settle_s: float = 240.0
    seed: int | None = None
    fault_every: tuple[float, float] = (1.0, 4.0)
    long_relay_pause_s: float = 65.0  # past the relay's 60 s claims (skipped when the run is too short)
    consumer_pause_s: tuple[float, float] = (7.0, 12.0)
    # Backend terminations aim at processes at work, not starting: a process younger than this is left
    # alone (0 aims at start-up too; the consumer runtime then exits: see tests/e2e/test_loop_survival.py).
    start_up_grace_s: float = 5.0
    # Components run under Debian's libfaketime with their wall clock offset, by name:
    # (("engine-1", "+5m"), ("consumer-1", "-5m")). Lease expiry and release times are the database's, so a
    # skewed process must neither double nor starve anything (TESTING.md, "Clock skew").
    clock_skew: tuple[tuple[str, str], ...] = ()


#: Occurrences per batch handler call of a batch consumer: small, so a few due at once already make a batch.
BATCH_SIZE = 20

#: libfaketime, as Debian's faketime package installs it ($LIB: the dynamic loader's own library directory).
FAKETIME_LIBRARY = "/usr/$LIB/faketime/libfaketime.so.1"


def faketime_env(offset: str) -> dict[str, str]:
    """The environment that runs a process with its wall clock off by ``offset`` ("+5m", "-5m").

    The library is preloaded directly rather than through the ``faketime`` command, which forks: signals
    would reach the wrapper, and stopping it orphaned the real process (found: a skewed engine left running
    after its test). The monotonic clock is left alone: it has no meaning across hosts, so skewing it tests
    nothing, and libfaketime's faked monotonic deadlines turn librdkafka's timed waits into a busy loop."""
    return {"LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@dataclass
class Report:
    started_at: str = ""
    faults: list[Fault] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    not_final: list[dict[str, Any]] = field(default_factory=list)
    reconcile: dict[str, Any] = field(default_factory=dict)
    reconcile_exit: int | None = None
    doubled_effects: list[dict[str, Any]] = field(default_factory=list)
    missing_effects: list[str] = field(default_factory=list)
    open_count_drift: dict[str, list[int]] = field(default_factory=dict)  # tenant: [counter, counted]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return (
            not self.exits
            and not self.not_final
            and not self.doubled_effects
            and not self.missing_effects
            and not self.open_count_drift
            and self.reconcile_exit == 0
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "started_at": self.started_at,
            "figures": self.figures,
            "faults": [vars(f) for f in self.faults],
            "exits": [vars(e) for e in self.exits],
            "not_final": self.not_final,
            "doubled_effects": self.doubled_effects,
            "missing_effects": self.missing_effects,
            "open_count_drift": self.open_count_drift,
            "reconcile_exit": self.reconcile_exit,
            "reconcile": self.reconcile,
        }

    def lines(self) -> list[str]:
        kinds: dict[str, int] = {}
        for fault in self.faults:
            kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
        counts = self.reconcile.get("counts", {})
        out = [
            f"chaos run {self.started_at}: {'CLEAN' if self.clean else 'NOT CLEAN'}",
            "  figures: " + ", ".join(f"{k} {v}" for k, v in self.figures.items()),
            f"  faults injected: {len(self.faults)} (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")",
            f"  processes that exited on their own: {len(self.exits)}",
            *[f"    {e.process} at {e.at_s:.1f} s, status {e.returncode}: {e.log_tail[-300:]!r}" for e in self.exits],
            f"  occurrences not final after settling: {len(self.not_final)}",
            *[f"    {o}" for o in self.not_final[:20]],
            f"  reconcile exit {self.reconcile_exit}: expected {counts.get('expected')}, missing"
            f" {counts.get('missing')}, unexpected {counts.get('unexpected')}, duplicate slots"
            f" {counts.get('duplicate_slots')}, policy violations {counts.get('policy_violations')},"
            f" effects never applied {counts.get('effects_never_applied')}, applied twice"
            f" {counts.get('effects_applied_twice')}, applied although CANCELED (a pause raced the consumer)"
            f" {counts.get('effects_applied_after_cancel')}",
            f"  effects doubled: {len(self.doubled_effects)}; SUCCEEDED without an effect: {len(self.missing_effects)}",
            f"  tenants whose open-occurrence counter parted from the count: {self.open_count_drift or 'none'}",
            "  faults:",
        ]
        out.extend(f"    {f.at_s:7.1f} s  {f.kind:<10} {f.target:<12} {f.detail}" for f in self.faults)
        return out


class Cluster:
    """The processes of a chaos run against one database server and one broker."""

    def __init__(self, admin_url: str, bootstrap: str, workdir: Path, options: Options) -> None:
        self.admin_url = admin_url
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.options = options
        suffix = uuid.uuid4().hex[:8]
        self.engine_db = f"chaos_{suffix}"
        self.consumer_db = f"chaos_consumer_{suffix}"
        self.engine_url = database_url(admin_url, self.engine_db)
        self.consumer_url = database_url(admin_url, self.consumer_db)
        self.components: dict[str, Component] = {}
        self.report = Report()
        self.began = time.monotonic()
        self.rng = random.Random(options.seed)
        self.targets = [f"chaos.{suffix}.t{i}" for i in range(options.targets)]
        # Its own consumer group: runs sharing a broker never wait for each other's departed members.
        self.group = f"chaos-{suffix}"
        self.tokens: dict[str, str] = {}
        self.schedules: list[tuple[str, str]] = []  # (tenant, schedule_id)
        self.api_url: str | None = None
        self.window_from: datetime | None = None
        self.watchers: list[asyncio.Task[None]] = []
        self.stopping = False
        self.pool: asyncpg.Pool | None = None
        self.consumer_pool: asyncpg.Pool | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def fault(self, kind: str, target: str, detail: str = "") -> None:
        self.report.faults.append(Fault(round(self.elapsed(), 2), kind, target, detail))
        print(f"  {self.elapsed():7.1f} s  {kind:<10} {target:<12} {detail}", flush=True)

    # ------------------------------------------------------------ set-up

    async def create_databases(self) -> None:
        admin = await asyncpg.connect(self.admin_url)
        try:
            for name in (self.engine_db, self.consumer_db):
                await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        self.pool = await asyncpg.create_pool(self.engine_url, min_size=1, max_size=4)
        self.consumer_pool = await asyncpg.create_pool(self.consumer_url, min_size=1, max_size=2)
        await self.consumer_pool.execute(EFFECTS_DDL)

    def env(self, name: str, database: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOQ_")}
        env.update(
            CHRONOQ_DATABASE_URL=with_query(database or self.engine_url, application_name=name),
            CHRONOQ_KAFKA_BOOTSTRAP=self.bootstrap,
            CHRONOQ_HOME=str(self.workdir / "home"),
            PYTHONUNBUFFERED="1",
        )
        return env

    async def cli(self, *argv: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *CHRONOQ,
            *argv,
            cwd=ROOT,
            env=self.env("chaos-cli"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"chronoq {' '.join(argv)} exited {process.returncode}: {err.decode()[-2000:]}")
        return out.decode()

    def add(self, name: str, kind: str, argv: list[str], env: dict[str, str]) -> Component:
        skew = dict(self.options.clock_skew).get(name)
        if skew is not None:
            env = {**env, **faketime_env(skew)}
        component = Component(name, kind, argv, env, self.workdir / f"{name}.log")
        self.components[name] = component
        return component

    async def start(self, component: Component) -> None:
        log = component.log.open("ab")
        try:
            component.process = await asyncio.create_subprocess_exec(
                *component.argv,
                cwd=ROOT,
                env=component.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log if component.kind != "api" else asyncio.subprocess.PIPE,
                stderr=log,
            )
        finally:
            log.close()
        component.starts += 1
        component.started_at = time.monotonic()
        component.expected_down = False
        component.paused = False
        self.watchers.append(asyncio.create_task(self.watch(component, component.process)))

    async def watch(self, component: Component, process: asyncio.subprocess.Process) -> None:
        """Record an exit nobody asked for, and bring the process back."""
        await process.wait()
        if component.process is not process or component.expected_down or self.stopping:
            return
        tail = component.log.read_text(errors="replace")[-2000:] if component.log.exists() else ""
        self.report.exits.append(Exit(component.name, round(self.elapsed(), 2), process.returncode, tail))
        print(f"  {self.elapsed():7.1f} s  EXITED     {component.name} status {process.returncode}", flush=True)
        await asyncio.sleep(1.0)
        if not self.stopping:
            await self.start(component)

    async def set_up(self) -> None:
        await self.create_databases()
        await self.cli("migrate")
        for i in range(self.options.tenants):
            tenant = f"chaos-{i}"
            self.tokens[tenant] = json.loads(await self.cli("tenant", "create", tenant, "--json"))["api_token"]
        api = self.add("api", "api", [*CHRONOQ, "api", "--api-port", "0"], self.env("api"))
        await self.start(api)
        assert api.process is not None and api.process.stdout is not None
        line = (await asyncio.wait_for(api.process.stdout.readline(), 30)).decode()
        self.api_url = line.split(" on ", 1)[1].strip()
        for i in range(self.options.engines):
            self.add(
                f"engine-{i + 1}",
                "engine",
                [*CHRONOQ, "engine", "--stuck-after", self.options.stuck_after],
                self.env(f"engine-{i + 1}"),
            )
        for i in range(self.options.relays):
            self.add(f"relay-{i + 1}", "relay", [*CHRONOQ, "relay"], self.env(f"relay-{i + 1}"))
        for i in range(self.options.consumers):
            name = f"consumer-{i + 1}"
            url = with_query(self.consumer_url, application_name=name)
            batch = BATCH_SIZE if i >= self.options.consumers - self.options.batch_consumers else 0
            self.add(
                name,
                "consumer",
                [
                    sys.executable,
                    "-m",
                    "load_tests.chaos_consumer",
                    "--bootstrap",
                    self.bootstrap,
                    "--database-url",
                    url,
                    "--targets",
                    ",".join(self.targets),
                    "--name",
                    name,
                    "--group",
                    self.group,
                    "--batch",
                    str(batch),
                ],
                self.env(name),
            )
        await asyncio.gather(*(self.start(c) for c in self.components.values() if c.kind != "api"))
        await self.create_schedules()

    async def create_schedules(self) -> None:
        assert self.api_url is not None and self.pool is not None
        self.window_from = await self.pool.fetchval("SELECT now()")
        tenants = sorted(self.tokens)
        clients = {t: ChronoqClient(self.api_url, self.tokens[t]) for t in tenants}
        # Every tenant schedules onto every target: an operator registers each to the first tenant and
        # grants it to the others (target ownership, docs/security.md), as a shared target needs.
        clock = DatabaseClock()
        for target in self.targets:
            await target_registry.register(self.pool, target, tenants[0], clock)
            for tenant in tenants[1:]:
                await target_registry.grant(self.pool, target, tenant, clock)
        # No wait for the grants to be published: a grant stranded on a killed relay's claim delays the granted
        # tenant's occurrences (their binding_version is ahead of the consumer's view: parked, not refused)
        # until the claim expires, within ConsumerConfig.binding_behind_timeout (docs/security.md).
        bodies = []
        for i in range(self.options.schedules):
            tenant = tenants[i % len(tenants)]
            target = self.targets[i % len(self.targets)]
            if i % 2 == 0:
                body: dict[str, Any] = {
                    "kind": "rate",
                    "expression": f"{self.rng.choice([5, 7, 10, 15, 20, 30])}s",
                    "target": target,
                }
            else:
                body = {
                    "kind": "cron",
                    "expression": self.rng.choice(["* * * * *", "*/2 * * * *"]),
                    "time_zone": self.rng.choice(["UTC", "Europe/Berlin", "America/New_York"]),
                    "target": target,
                }
            body["payload"] = {"n": i}
            body["misfire_policy"] = self.rng.choice(["fire_once", "skip", "catch_up:3"])
            bodies.append((tenant, body))

        async def create(tenant: str, body: dict[str, Any]) -> None:
            created = await clients[tenant].create_schedule(body, idempotency_key=f"chaos-{body['payload']['n']}")
            self.schedules.append((tenant, created["schedule_id"]))

        for start in range(0, len(bodies), 20):
            await asyncio.gather(*(create(t, b) for t, b in bodies[start : start + 20]))

    # ------------------------------------------------------------ faults

    def pick(self, *kinds: str, working: bool = False) -> Component | None:
        """A random running, unpaused process of ``kinds``; ``working``: past its start-up grace too."""
        grace = self.options.start_up_grace_s if working else 0.0
        now = time.monotonic()
        candidates = [
            c
            for c in self.components.values()
            if c.kind in kinds and c.running and not c.paused and now - c.started_at >= grace
        ]
        return self.rng.choice(candidates) if candidates else None

    def down(self) -> int:
        return sum(1 for c in self.components.values() if c.kind != "api" and (not c.running or c.paused))

    async def kill(self) -> None:
        component = self.pick("engine", "relay", "consumer")
        if component is None or self.down() >= 2:
            return
        component.expected_down = True
        assert component.process is not None
        component.process.send_signal(signal.SIGKILL)
        await component.process.wait()
        delay = self.rng.uniform(0.5, 3.0)
        self.fault("kill", component.name, f"pid {component.pid}, restart in {delay:.1f} s")
        asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(self.restart(component)))

    async def restart(self, component: Component) -> None:
        if not self.stopping and not component.running:
            await self.start(component)

    async def pause(self, component: Component | None = None, seconds: float | None = None) -> None:
        component = component or self.pick("engine", "relay", "consumer")
        if component is None or self.down() >= 2:
            return
        if seconds is None:
            low, high = self.options.consumer_pause_s
            seconds = self.rng.uniform(low, high)
        assert component.process is not None
        component.paused = True
        component.process.send_signal(signal.SIGSTOP)
        self.fault("pause", component.name, f"SIGSTOP for {seconds:.1f} s")

        async def resume() -> None:
            await asyncio.sleep(seconds)
            if component.running and component.paused:
                component.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            component.paused = False

        asyncio.ensure_future(resume())

    async def backends(self, name: str, states: tuple[str, ...], query_like: str | None = None) -> list[asyncpg.Record]:
        assert self.pool is not None
        return await self.pool.fetch(
            "SELECT pid, state, left(query, 60) AS query FROM pg_stat_activity"
            " WHERE application_name = $1 AND state = ANY($2::text[]) AND pid <> pg_backend_pid()"
            " AND ($3::text IS NULL OR query LIKE $3)",
            name,
            list(states),
            query_like,
        )

    async def terminate(
        self,
        kind: str,
        component: Component,
        states: tuple[str, ...],
        query_like: str | None = None,
        wait_s: float = 3.0,
    ) -> None:
        """Terminate the process's backends in ``states`` as soon as one shows up (polling for ``wait_s``)."""
        assert self.pool is not None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found = await self.backends(component.name, states, query_like)
            if found:
                for backend in found:
                    await self.pool.execute("SELECT pg_terminate_backend($1)", backend["pid"])
                self.fault(kind, component.name, "; ".join(f"{b['state']}: {b['query']!r}" for b in found))
                return
            await asyncio.sleep(0.01)
        self.report.figures["faults_without_a_target"] = self.report.figures.get("faults_without_a_target", 0) + 1

    async def terminate_any(self) -> None:
        component = self.pick("engine", "relay", "consumer", working=True)
        if component is None:
            return
        state = self.rng.choice(["idle", "idle in transaction", "active"])
        await self.terminate("terminate", component, (state,))

    async def claim_mark(self) -> None:
        component = self.pick("relay", "engine", working=True)
        if component is None:
            return
        if component.kind == "relay":
            # The late lane: the claim is the relay's only statement touching publish_attempts; idle after
            # it = publishing, before the mark.
            await self.terminate("claim_mark", component, ("idle",), "%publish_attempts%")
        else:
            # The ahead lane (an engine node): the page read is the only statement naming occurrence_header;
            # idle after it = the page is being published, before its cursor moves.
            await self.terminate("page_cursor", component, ("idle",), "%occurrence_header%")

    async def in_handler(self) -> None:
        component = self.pick("consumer", working=True)
        if component is not None:
            await self.terminate("handler", component, ("idle in transaction",))

    async def control(self) -> None:
        assert self.api_url is not None
        tenant, schedule_id = self.rng.choice(self.schedules)
        client = ChronoqClient(self.api_url, self.tokens[tenant])
        try:
            paused = await client.pause_schedule(schedule_id)
            self.fault("control", "api", f"paused {schedule_id} (v{paused['version']})")
            await asyncio.sleep(self.rng.uniform(1.0, 5.0))
            resumed = await client.resume_schedule(schedule_id)
            self.fault("control", "api", f"resumed {schedule_id} (v{resumed['version']})")
        except Exception as err:  # noqa: BLE001 - the API process may be the one just failing; note it
            self.fault("control", "api", f"refused: {err!r}"[:200])

    async def inject(self, seconds: float) -> None:
        """Faults until ``seconds`` have passed."""
        end = time.monotonic() + seconds
        actions = [
            (self.kill, 3),
            (self.pause, 2),
            (self.terminate_any, 4),
            (self.claim_mark, 2),
            (self.in_handler, 2),
            (self.control, 1),
        ]
        long_pause_at = time.monotonic() + seconds / 3 if seconds > 2 * self.options.long_relay_pause_s else None
        pending: set[asyncio.Task[None]] = set()
        while time.monotonic() < end:
            if long_pause_at is not None and time.monotonic() >= long_pause_at:
                long_pause_at = None
                relay = self.pick("relay")
                if relay is not None:
                    await self.pause(relay, self.options.long_relay_pause_s)
            action = self.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
            task = asyncio.create_task(action())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(self.rng.uniform(*self.options.fault_every))
        await asyncio.gather(*pending, return_exceptions=True)

    # ------------------------------------------------------------ settle and check

    async def resume_all(self) -> None:
        for component in self.components.values():
            if component.paused and component.running:
                component.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
                component.paused = False
            if not component.running and not self.stopping:
                await self.start(component)

    async def unfinished(self, until: datetime) -> list[asyncpg.Record]:
        assert self.pool is not None and self.window_from is not None
        return await self.pool.fetch(
            "SELECT occurrence_id, schedule_id, scheduled_for, state, updated_at FROM occurrences"
            " WHERE scheduled_for >= $1 AND scheduled_for < $2 AND state <> ALL($3::text[])"
            " ORDER BY scheduled_for",
            self.window_from,
            until,
            list(FINAL),
        )

    async def settle(self, until: datetime) -> None:
        deadline = time.monotonic() + self.options.settle_s
        while time.monotonic() < deadline:
            await self.resume_all()
            if not await self.unfinished(until):
                return
            await asyncio.sleep(1.0)

    async def check(self, until: datetime) -> None:
        assert self.pool is not None and self.consumer_pool is not None and self.window_from is not None
        report = self.report
        report.not_final = [
            {
                "occurrence_id": str(r["occurrence_id"]),
                "schedule_id": str(r["schedule_id"]),
                "scheduled_for": r["scheduled_for"].isoformat(),
                "state": r["state"],
                "since": r["updated_at"].isoformat(),
            }
            for r in await self.unfinished(until)
        ]
        process = await asyncio.create_subprocess_exec(
            *CHRONOQ,
            "reconcile",
            "--from",
            self.window_from.isoformat(),
            "--to",
            until.isoformat(),
            "--json",
            "--consumer-database",
            self.consumer_url,
            "--stuck-after",
            "1m",
            cwd=ROOT,
            env=self.env("reconcile"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        report.reconcile_exit = process.returncode
        try:
            report.reconcile = json.loads(out.decode())
        except ValueError:
            report.reconcile = {"error": err.decode()[-2000:]}
        doubled = await self.consumer_pool.fetch(
            "SELECT occurrence_id, count(*) AS effects, array_agg(worker) AS workers FROM chaos_effects"
            " GROUP BY occurrence_id HAVING count(*) > 1"
        )
        report.doubled_effects = [
            {"occurrence_id": str(r["occurrence_id"]), "effects": r["effects"], "workers": list(r["workers"])}
            for r in doubled
        ]
        applied = {
            r["occurrence_id"] for r in await self.consumer_pool.fetch("SELECT occurrence_id FROM chaos_effects")
        }
        succeeded = await self.pool.fetch(
            "SELECT occurrence_id FROM occurrences WHERE state = 'SUCCEEDED' AND scheduled_for >= $1"
            " AND scheduled_for < $2",
            self.window_from,
            until,
        )
        report.missing_effects = [str(r["occurrence_id"]) for r in succeeded if r["occurrence_id"] not in applied]
        # The tenant gate's open counter (migration 0027) survived every kill and terminated backend.
        report.open_count_drift = {
            tenant: list(counts) for tenant, counts in (await open_count_drift(self.pool)).items()
        }
        states = {
            r["state"]: r["n"]
            for r in await self.pool.fetch(
                "SELECT state, count(*) AS n FROM occurrences WHERE scheduled_for >= $1 AND scheduled_for < $2"
                " GROUP BY state",
                self.window_from,
                until,
            )
        }
        report.figures.update(
            occurrences=sum(states.values()),
            states=states,
            effects=len(applied),
            schedules=len(self.schedules),
            restarts={c.name: c.starts - 1 for c in self.components.values() if c.starts > 1},
        )

    async def stop(self) -> None:
        self.stopping = True
        for component in self.components.values():
            if component.running:
                if component.paused:
                    component.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
                component.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for component in self.components.values():
            if component.process is not None and component.process.returncode is None:
                try:
                    await asyncio.wait_for(component.process.wait(), 15)
                except TimeoutError:
                    component.process.kill()
                    await component.process.wait()
        for task in self.watchers:
            task.cancel()
        await asyncio.gather(*self.watchers, return_exceptions=True)
        for pool in (self.pool, self.consumer_pool):
            if pool is not None:
                await pool.close()

    async def drop_databases(self) -> None:
        admin = await asyncpg.connect(self.admin_url)
        try:
            for name in (self.engine_db, self.consumer_db):
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def run(admin_url: str, bootstrap: str, options: Options, workdir: Path, keep: bool = False) -> Report:
    """One chaos run on the given servers; the report says what happened."""
    cluster = Cluster(admin_url, bootstrap, workdir, options)
    cluster.report.started_at = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        print(
            f"setting up: {options.engines} engines, {options.relays} relays, {options.consumers} consumers,"
            f" {options.schedules} schedules",
            flush=True,
        )
        await cluster.set_up()
        set_up_s = cluster.elapsed()
        print(f"faults for {options.minutes} min", flush=True)
        began = time.monotonic()
        await cluster.inject(options.minutes * 60)
        assert cluster.pool is not None
        until = await cluster.pool.fetchval("SELECT now()")
        fault_s = time.monotonic() - began
        print("settling", flush=True)
        began = time.monotonic()
        await cluster.settle(until)
        settle_s = time.monotonic() - began
        await cluster.check(until)
        cluster.report.figures.update(
            set_up_s=round(set_up_s, 1),
            faults_s=round(fault_s, 1),
            settle_s=round(settle_s, 1),
            faults=len(cluster.report.faults),
        )
    finally:
        await cluster.stop()
        if not keep:
            await cluster.drop_databases()
    return cluster.report


async def main(args: argparse.Namespace) -> int:
    from engine.cli.embedded.postgres import EmbeddedPostgres
    from engine.cli.embedded.tansu import EmbeddedKafka

    options = Options(
        minutes=args.minutes,
        engines=args.engines,
        relays=args.relays,
        consumers=args.consumers,
        batch_consumers=args.batch_consumers,
        schedules=args.schedules,
        tenants=args.tenants,
        seed=args.seed,
        start_up_grace_s=0.0 if args.start_up_faults else 5.0,
    )
    workdir = Path(tempfile.mkdtemp(prefix="chronoq-chaos-"))
    admin_url, bootstrap = os.environ.get("CHRONOQ_ADMIN_URL"), os.environ.get("CHRONOQ_KAFKA_BOOTSTRAP")
    postgres = kafka = None
    if not (admin_url and bootstrap):
        # The topology's connection budget, above PostgreSQL's default of 100: a consumer process holds up to
        # min(max_in_flight, 32) + 2 (34; the barrier keeps a delivery's transaction open until the engine
        # answers), an engine node 8 + its data-plane pool, a relay 8, plus the API and this harness.
        # Processes restarted into a full server wait for a slot (create_pool_when_ready); sized here so
        # that they get one.
        postgres = EmbeddedPostgres(workdir / "postgres", settings={"max_connections": "400"})
        kafka = EmbeddedKafka(workdir / "kafka.log")
        postgres.start()
        bootstrap = kafka.start()
        admin_url = postgres.url("postgres")
    try:
        report = await run(admin_url, bootstrap, options, workdir, keep=args.keep)
    finally:
        if kafka is not None:
            kafka.stop()
        if postgres is not None:
            postgres.stop()
    print("\n".join(report.lines()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2, default=str))
    print(f"process logs: {workdir}", flush=True)
    if report.clean and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.clean else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--batch-consumers", type=int, default=1, help="how many of the consumers run batch handlers")
    parser.add_argument("--schedules", type=int, default=300)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the databases and logs")
    parser.add_argument(
        "--start-up-faults",
        action="store_true",
        help="also terminate backends of processes still starting (the consumer runtime exits)",
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
