"""Target bindings: which tenants may have occurrences delivered to a target.

A target (the handler an occurrence topic feeds) belongs to the tenant that
first created a schedule on it, or that an operator registered it to; an
operator may grant it to further tenants. The engine refuses schedules on a
target the tenant may not use, and announces every change of a target's
tenants on the compacted topic ``chronoq.target-bindings``, keyed by target,
through the outbox (so the announcement is committed with the change)::

    {"format": 1, "target": "billing.invoice", "tenants": ["acme", "globex"],
     "version": 3, "changed_at": "2026-11-29T10:00:00Z"}

``tenants`` is the full set after the change (the owner first), so compaction
keeping the latest record per target loses nothing; ``version`` increases
with every change of one target, so a reader keeps the highest it saw whatever
the order of delivery. A consumer app reads the topic from the beginning and
accepts an occurrence only if its tenant is bound to its target
(``consumers/target_bindings.py``).

In production only the engine's principal may write this topic (and the
occurrence topics): see ``docs/security.md`` for the Kafka ACLs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson

from schemas import record_fields as fields
from schemas.errors import InvalidInput, MalformedMessage
from schemas.messages import FORMAT_VERSION, decode_json_object, format_instant
from schemas.topics import TENANT_ID_PATTERN, validate_target

#: A target bound to more tenants than this is refused (the record must stay small).
MAX_TENANTS_PER_TARGET = 1000


@dataclass(frozen=True)
class TargetBindingMessage:
    target: str
    tenants: tuple[str, ...]
    version: int
    changed_at: datetime

    @property
    def key(self) -> bytes:
        """Keyed by target so compaction keeps the latest binding of each target."""
        return self.target.encode()

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "format": FORMAT_VERSION,
                "target": self.target,
                "tenants": list(self.tenants),
                "version": self.version,
                "changed_at": format_instant(self.changed_at),
            }
        )


def decode_target_binding(value: bytes | None) -> TargetBindingMessage:
    """Decode a target binding record or raise MalformedMessage (and nothing else)."""
    data = decode_json_object(value, "target binding")
    target = fields.text(data, "target", 100)
    try:
        validate_target(target)
    except InvalidInput as err:
        raise MalformedMessage(f"field 'target' is not a target name: {target[:60]!r}", "target") from err
    tenants = data.get("tenants")
    if not isinstance(tenants, list) or len(tenants) > MAX_TENANTS_PER_TARGET:
        raise MalformedMessage(
            f"field 'tenants' must be a list of at most {MAX_TENANTS_PER_TARGET} tenant ids", "tenants"
        )
    for tenant in tenants:
        if not isinstance(tenant, str) or not TENANT_ID_PATTERN.fullmatch(tenant):
            raise MalformedMessage("field 'tenants' must hold tenant ids only", "tenants")
    return TargetBindingMessage(
        target, tuple(tenants), fields.integer(data, "version"), fields.instant(data, "changed_at")
    )
