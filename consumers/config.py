"""Configuration of a consumer app: one frozen dataclass, checked by ``validate()``."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from schemas.attempt_credentials import AttemptCredential
from schemas.capped_backoff import capped_doubling
from schemas.kafka_security import PLAINTEXT, KafkaSecurity
from schemas.topics import DEFAULT_PARTITIONS


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ConsumerConfig:
    """group: Kafka consumer group; also the dedupe scope (one effect per group).
    kafka_bootstrap: "host:port[,host:port]".
    database_url: the app's own PostgreSQL (holds the dedupe table and the effects).
    max_poll_records: messages fetched per poll, and buffered per partition before
        fetching from it pauses (default 100).
    fetch_wait: seconds a fetch of the app's occurrence topics may wait at the broker for records
        (aiokafka's ``fetch_max_wait_ms``; default 0.5, Kafka's). Apache Kafka answers as soon as a record
        arrives; the embedded tansu broker answers a fetch of several partitions only when the wait runs
        out, so there a lone occurrence waits up to ~0.35 s for the app to see it (docs/broker.md). The
        CLI's consumers on tansu use 0.05, at the price of an empty fetch twenty times a second while idle.
        At most 10.
    redelivery_backoff / redelivery_backoff_max: seconds between in-place retries of a
        delivery that hit an infrastructure error (app database or broker
        unavailable), doubling up to the maximum. Handler failures are not retried
        in place: the engine schedules their retries.
    partitions: partitions of the topics this app creates if missing.
    metadata_refresh: seconds between metadata refreshes (how soon a pattern
        subscription sees a new target's topic).
    session_timeout / heartbeat_interval: group membership timing (s). A dead
        member's partitions move after session_timeout. On the embedded tansu
        broker a group's first join also takes about half the session timeout
        and a member that left still counts until its session expires, so
        short-lived consumers there use a short session (see docs/broker.md).
    lease_ttl: seconds an attempt's lease lasts without a heartbeat (default 30).
        The engine times out an attempt whose lease expired and retries it.
    lease_renew_interval: seconds between the automatic lease heartbeats of an
        attempt, from sending its ``started`` (through the wait for the engine's
        answer and the handler) to its commit (default lease_ttl / 3).
    handler_timeout: default per-target handler timeout in seconds (default 300);
        a handler that overruns fails transiently ("HandlerTimeout").
    concurrency: default per-target limit of handlers running at once in this
        process (default 1); ``@app.handler(target, concurrency=n)`` overrides it.
    max_in_flight: limit of deliveries in flight in this process, all targets
        together (default 64).
    shutdown_grace: seconds the first SIGTERM lets in-flight handlers finish before
        they are aborted (default 30).
    transaction_idle_timeout: seconds an attempt's transaction may sit idle before
        PostgreSQL ends it (default handler_timeout + lease_ttl): a worker paused or
        stuck inside its transaction cannot keep the dedupe row locked for ever, so
        the retry elsewhere proceeds and the late commit fails. It must exceed
        handler_timeout: a handler may spend all of its time outside the database
        (an HTTP call, a computation) and must still be able to commit.
    dedupe_lock_timeout: seconds a delivery waits for another attempt's
        uncommitted dedupe row before it backs off and tries again later
        (default lease_ttl).
    report_attempts: send attempt events to the engine (default True). Turn it off
        for a second group that only observes a target another app owns.
    report_timeout: seconds to wait for the broker to acknowledge an attempt event (default 10). A
        ``started`` not acknowledged in time is sent again with the same lease token (the broker may have
        written it) for up to ``attempt_grant_timeout``; an outcome is sent again until it is acknowledged.
    group_attempt_events: send the events of a batch handler's deliveries (and of each heartbeat round)
        as group records, one per partition of ``chronoq.attempts``, instead of one record per event (default
        True; ``schemas/attempt_events.py``, format 2): a fraction of the runtime's and the engine's cost per
        occurrence, and the engine answers such ``started`` in groups too. Needs engines that read groups
        (this release on): upgrade the engines first, or turn it off while an older engine runs.
    attempt_barrier: call a handler only after the engine answered its ``started`` with ``granted``
        (default True; docs/state-machine.md, "Cancel as a barrier"): a cancel the engine committed first
        is never applied, even when the schedule-state view has not read it yet. Off, the runtime falls
        back to the view-only guarantee (a cancel inside the view's lag may still be applied, once).
        Needs ``report_attempts`` (nothing is asked otherwise) and READ on ``chronoq.attempt-grants``; an
        occurrence the engine does not know is refused (``unknown``), and with no attempt processor running
        nothing is granted, so an app run without an engine (a test harness) turns it off.
    attempt_grant_timeout: seconds to wait for that answer (default lease_ttl, or half of
        transaction_idle_timeout if that is shorter). No answer in time: while the lease lasts, the same
        ``started`` is sent again and the wait starts again (three waits in all); then the attempt's
        transaction is rolled back and the delivery retried in place with a new claim (no attempt
        consumed). It must be below transaction_idle_timeout: the transaction waits idle.
    state_catch_up_timeout: seconds to read the schedule-state topic at start-up
        before handling occurrences (default 30; the app starts anyway after it).
    worker: this process's name in attempt events (default host:pid).
    tenants: the only tenants whose occurrences this app runs, whatever the
        target bindings say (default None: the tenants bound to each target).
        Others are dead-lettered. Set it when the app serves known tenants.
    kafka_security: TLS and SASL of every Kafka client of the app (default PLAINTEXT;
        :class:`schemas.kafka_security.KafkaSecurity`).
    binding_wait: seconds an occurrence of a tenant its target is not bound to
        waits for the target-binding topic to be read to its end (a grant may be
        on its way) before it is dead-lettered (default 5).
    binding_behind_timeout: seconds an occurrence whose ``binding_version`` is newer
        than the app's view of the target bindings is retried in place (parked: the
        offset is not committed past it, later records run) before it is
        dead-lettered as "binding view behind" (default 90: the relay's claim ttl,
        60 s, after which another relay publishes a binding a killed relay had
        claimed, plus a margin). It bounds how long a record claiming a version
        that never comes (a forgery) holds its partition's committed offset.
    attempt_credentials: target -> attempt credential token (``cqa_...``, from
        ``chronoq target credential issue|rotate <target>``). Every attempt event
        about an occurrence of such a target is signed with it; the engine
        rejects unsigned events for a target that has a credential
        (docs/security.md). Never shown in ``repr``. ``chronoq consume`` reads
        it from ``CHRONOQ_ATTEMPT_CREDENTIALS`` (``target=cqa_...,...``).
    stall_timeout: seconds the app may sit idle (nothing in flight, nothing
        queued, no partition paused) while an assigned partition has records past
        its position, before it recreates its Kafka consumer (default 60). aiokafka's
        consumer can wedge after a broker restart, alive but fetching nothing
        (aio-libs/aiokafka#703, #1154); the new consumer rejoins the group and
        reads on from the committed offsets, so nothing is lost and nothing
        already applied runs again (the dedupe rows).
    """

    group: str
    kafka_bootstrap: str
    database_url: str
    max_poll_records: int = 100
    fetch_wait: float = 0.5
    redelivery_backoff: float = 0.2
    redelivery_backoff_max: float = 10.0
    partitions: int = DEFAULT_PARTITIONS
    metadata_refresh: float = 5.0
    session_timeout: float = 10.0
    heartbeat_interval: float = 3.0
    lease_ttl: float = 30.0
    lease_renew_interval: float | None = None
    handler_timeout: float = 300.0
    concurrency: int = 1
    max_in_flight: int = 64
    shutdown_grace: float = 30.0
    transaction_idle_timeout: float | None = None
    dedupe_lock_timeout: float | None = None
    report_attempts: bool = True
    report_timeout: float = 10.0
    group_attempt_events: bool = True
    attempt_barrier: bool = True
    attempt_grant_timeout: float | None = None
    state_catch_up_timeout: float = 30.0
    worker: str = field(default_factory=_worker_id)
    tenants: frozenset[str] | None = None
    binding_wait: float = 5.0
    binding_behind_timeout: float = 90.0
    kafka_security: KafkaSecurity = PLAINTEXT
    attempt_credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    stall_timeout: float = 60.0

    def credentials(self) -> dict[str, AttemptCredential]:
        """The parsed credentials by target (ValueError naming the target whose token is malformed)."""
        parsed: dict[str, AttemptCredential] = {}
        for target, token in self.attempt_credentials.items():
            try:
                parsed[target] = AttemptCredential.from_token(token)
            except ValueError as err:
                raise ValueError(f"attempt_credentials[{target!r}]: {err}") from None
        return parsed

    @property
    def renew_interval(self) -> float:
        return self.lease_renew_interval if self.lease_renew_interval is not None else self.lease_ttl / 3

    @property
    def idle_timeout(self) -> float:
        if self.transaction_idle_timeout is not None:
            return self.transaction_idle_timeout
        # Room for a handler that idles in its transaction for its whole timeout, then commits.
        return self.handler_timeout + self.lease_ttl

    def redelivery_delays(self) -> Iterator[float]:
        """The waits between in-place retries of one step: ``redelivery_backoff`` doubled up to
        ``redelivery_backoff_max`` (a new iterator starts again from the first)."""
        return capped_doubling(self.redelivery_backoff, self.redelivery_backoff_max)

    @property
    def grant_timeout(self) -> float:
        if self.attempt_grant_timeout is not None:
            return self.attempt_grant_timeout
        # The lease ttl, but never so long that PostgreSQL ends the transaction waiting idle for the answer.
        return min(self.lease_ttl, self.idle_timeout / 2)

    @property
    def barrier(self) -> bool:
        """Whether handlers wait for the engine's grant (the barrier asks through attempt reports)."""
        return self.attempt_barrier and self.report_attempts

    def idle_timeout_for(self, handler_timeout: float) -> float:
        """The idle-in-transaction limit of a target whose handler has ``handler_timeout`` seconds: the app's
        ``transaction_idle_timeout`` if it exceeds that, else ``handler_timeout + lease_ttl`` — a handler that
        works outside the database for its whole (per-target) timeout can still commit, and a stalled one
        still releases its dedupe row a lease after its timeout."""
        if self.idle_timeout > handler_timeout:
            return self.idle_timeout
        return handler_timeout + self.lease_ttl

    @property
    def lock_timeout(self) -> float:
        return self.dedupe_lock_timeout if self.dedupe_lock_timeout is not None else self.lease_ttl

    def _check_ranges(self) -> None:
        """ValueError for a setting outside its own range (the relations between settings: validate)."""
        positive = (
            "max_poll_records",
            "fetch_wait",
            "redelivery_backoff",
            "session_timeout",
            "heartbeat_interval",
            "lease_ttl",
            "handler_timeout",
            "concurrency",
            "max_in_flight",
            "report_timeout",
            "stall_timeout",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.fetch_wait > 10:
            raise ValueError(
                f"fetch_wait ({self.fetch_wait:g} s) must be at most 10 s: a fetch that waits longer outlives the"
                " client's request timeout and holds up shutdown (0.5, Kafka's default, suits Apache Kafka)"
            )
        for name in ("binding_wait", "binding_behind_timeout", "shutdown_grace"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    def validate(self) -> None:
        self._check_ranges()
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError("heartbeat_interval must be shorter than session_timeout")
        if not 0 < self.renew_interval <= self.lease_ttl / 2:
            raise ValueError(
                "lease_renew_interval must be positive and at most half of lease_ttl,"
                " so one lost heartbeat does not expire the lease"
            )
        if self.idle_timeout <= 0 or self.lock_timeout <= 0:
            raise ValueError("transaction_idle_timeout and dedupe_lock_timeout must be positive")
        self.kafka_security.validate()
        if self.tenants is not None and not self.tenants:
            raise ValueError("tenants must name at least one tenant (or be None for the target bindings)")
        if self.idle_timeout <= self.handler_timeout:
            raise ValueError(
                f"transaction_idle_timeout ({self.idle_timeout:g} s) must exceed handler_timeout"
                f" ({self.handler_timeout:g} s): PostgreSQL would end the transaction of a handler that"
                " works outside the database within its timeout, and it could never commit; raise"
                " transaction_idle_timeout (or leave it unset) or lower handler_timeout"
            )
        if self.grant_timeout <= 0:
            raise ValueError(
                f"attempt_grant_timeout ({self.grant_timeout:g} s) must be positive: it bounds the wait for the"
                " engine's answer to started (leave it unset for lease_ttl)"
            )
        if self.barrier and self.grant_timeout >= self.idle_timeout:
            raise ValueError(
                f"attempt_grant_timeout ({self.grant_timeout:g} s) must be below transaction_idle_timeout"
                f" ({self.idle_timeout:g} s): the attempt's transaction waits idle for the grant, and PostgreSQL"
                " would end it first; lower attempt_grant_timeout or raise transaction_idle_timeout"
            )
        self.credentials()
