"""Lateness at dispatch: the misfire rule applied again when an on-time occurrence reaches a relay late.

Pure, and in ``schemas`` because both sides need it: the engine's misfire
decision (``engine.rules.timing.misfire``) uses the policy and the threshold
when it materializes, and the relays (which never import the engine) apply
:func:`decide_dispatch` to the deliveries they reach after their
``late_after`` (the relay or the broker was down). One implementation of the
rule, property-tested in tests/unit/test_misfire_recovery.py.

Each delivery of an on-time occurrence carries what the relay needs (columns
``late_after`` and ``misfire_policy`` of ``dispatch_queue`` and ``outbox``):
``late_after = available_at + late_threshold(policy, on_time_limit)`` and the
schedule's stored policy text; :func:`stored_policy` turns them back into a
:class:`MisfirePolicy`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

__all__ = [
    "MisfirePolicy",
    "DispatchDecision",
    "LateDelivery",
    "LateVerdict",
    "late_threshold",
    "decide_dispatch",
    "stored_policy",
    "judge_late",
]


@dataclass(frozen=True, slots=True)
class MisfirePolicy:
    """What to do with fire instants that are more than ``max_lateness`` late."""

    kind: Literal["skip", "fire_once", "catch_up"]
    catch_up_limit: int = 0  # K for catch_up
    max_lateness: timedelta = timedelta(minutes=1)


@dataclass(frozen=True)
class DispatchDecision:
    """What the dispatcher does with one schedule's due on-time occurrences."""

    publish: list[datetime]  # due instants of those to publish (oldest first)
    missed: list[datetime]  # those to record MISSED instead: too late for the policy (oldest first)


def late_threshold(policy: MisfirePolicy, on_time_limit: timedelta | None = None) -> timedelta:
    """How late an instant may be and still count as on time: ``max_lateness``, capped by ``on_time_limit``."""
    if on_time_limit is None:
        return policy.max_lateness
    if on_time_limit < timedelta(0):
        raise ValueError("on_time_limit must not be negative")
    return min(policy.max_lateness, on_time_limit)


def stored_policy(text: str, threshold: timedelta) -> MisfirePolicy:
    """The policy a delivery row carries (the schedule's validated text: skip, fire_once or catch_up:K),
    with its lateness threshold (``late_after - available_at``)."""
    raw = text.strip().lower()
    if raw in ("skip", "fire_once"):
        return MisfirePolicy(raw, 0, threshold)  # type: ignore[arg-type]
    kind, _, limit = raw.partition(":")
    if kind != "catch_up" or not limit.isdigit():
        raise ValueError(f"misfire_policy {text[:30]!r} is not skip, fire_once or catch_up:K")
    return MisfirePolicy("catch_up", int(limit), threshold)


def _naive(instant: datetime, name: str) -> datetime:
    if instant.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime (UTC), got naive {instant!r}")
    return instant.astimezone(UTC).replace(tzinfo=None)


def decide_dispatch(
    due: Sequence[datetime], now: datetime, policy: MisfirePolicy, *, on_time_limit: timedelta | None = None
) -> DispatchDecision:
    """Lateness checked again at dispatch, for ONE schedule's on-time occurrences due now.

    ``due`` holds the due instants (``available_at``: ``scheduled_for`` for
    strict work, the jittered instant for flexible work) of every such
    occurrence of the schedule not yet published (the caller passes them all
    at once: the policy counts per schedule). Those still on time (``now - t``
    within :func:`late_threshold`) are published. Of the late ones — the relay
    or the broker was down while they came due — ``skip`` publishes none,
    ``fire_once`` the most recent unless an on-time one is published with it,
    ``catch_up:K`` the K most recent; the rest are recorded MISSED. Catch-up
    occurrences (the engine's ``MisfireDecision.catch_up``) were late by
    design: they are not passed here, the tenant's token bucket paces them.
    """
    current = _naive(now, "now")
    late_before = current - late_threshold(policy, on_time_limit)
    instants = sorted({_naive(instant, "due") for instant in due})
    on_time = [t for t in instants if t >= late_before]
    late = [t for t in instants if t < late_before]
    if policy.kind == "catch_up":
        allowed = policy.catch_up_limit
    elif policy.kind == "fire_once":
        allowed = 0 if any(t <= current for t in on_time) else 1
    else:
        allowed = 0
    published_late = late[len(late) - allowed :] if allowed else []
    missed = late[: len(late) - len(published_late)]
    return DispatchDecision(
        publish=[t.replace(tzinfo=UTC) for t in sorted(published_late + on_time)],
        missed=[t.replace(tzinfo=UTC) for t in missed],
    )


@dataclass(frozen=True)
class LateDelivery:
    """A due, unpublished delivery of an on-time occurrence, as a relay reads it.

    handle: the caller's name for the row (its key). schedule: what groups the
    rows of one schedule (its id, or its record key). due: available_at.
    late_after: the instant after which it is late. policy: the stored policy text.
    """

    handle: Hashable
    schedule: Hashable
    due: datetime
    late_after: datetime
    policy: str


@dataclass
class LateVerdict:
    """missed: handles to record MISSED instead of publishing. published_late: late handles the policy
    still publishes (exempt from further judgement: the K most recent were chosen once)."""

    missed: list[Hashable] = field(default_factory=list)
    published_late: list[Hashable] = field(default_factory=list)


def judge_late(deliveries: Sequence[LateDelivery], now: datetime) -> LateVerdict:
    """:func:`decide_dispatch` per schedule over every due, unpublished delivery a relay found for it.

    Deliveries are grouped by (schedule, policy, threshold); a delivery not yet late stays as it is.
    """
    groups: dict[tuple[Hashable, str, timedelta], list[LateDelivery]] = {}
    for delivery in deliveries:
        key = (delivery.schedule, delivery.policy, delivery.late_after - delivery.due)
        groups.setdefault(key, []).append(delivery)
    verdict = LateVerdict()
    for (_, policy, threshold), members in groups.items():
        decision = decide_dispatch([m.due for m in members], now, stored_policy(policy, threshold))
        missed = set(decision.missed)
        published = set(decision.publish)
        for member in members:
            instant = member.due.astimezone(UTC)
            if instant in missed:
                verdict.missed.append(member.handle)
            elif instant in published and member.late_after < now:
                verdict.published_late.append(member.handle)
    return verdict
