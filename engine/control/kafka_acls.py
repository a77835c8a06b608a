"""The Kafka ACLs of a tenant's consumer app: the production shape of tenant isolation on the broker.

On a broker with an authorizer (Apache Kafka's StandardAuthorizer and
``allow.everyone.if.no.acl.found=false``), a principal may do nothing it was
not granted. A tenant's consumer app needs, and gets, exactly:

====================================  ========  ===========================================================
resource                              may       why
====================================  ========  ===========================================================
topic ``chronoq.occurrences.<X>``     READ      for each target X the tenant owns or was granted (literal)
topic ``chronoq.schedule-states``     READ      skip occurrences of canceled schedules (runtime view)
topic ``chronoq.target-bindings``     READ      check each occurrence's tenant against its target
topic ``chronoq.attempt-grants``      READ      the engine's granted/refused answer to ``started`` (barrier)
group ``<tenant>.`` (prefixed)        READ      its consumer groups must be named ``<tenant>.<name>``
topic ``chronoq.attempts``            WRITE     report attempts to the engine
topic ``chronoq.dead-letters``        WRITE     set aside a record it cannot run (hostile or malformed)
====================================  ========  ===========================================================

READ and WRITE imply DESCRIBE, which is all the runtime's metadata and
offset look-ups need. No CREATE: ``--apply`` creates the topics the ACLs name
(with chronoq's topic settings) as the administrator, so the app finds them
and never needs to. Another tenant's occurrence topic is neither readable
nor even visible to this principal, and it can write no topic the engine
writes (occurrences, schedule states, bindings, command results, attempt grants: a forged
``granted`` would let a canceled occurrence run).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest

from schemas.errors import ChronoqError
from schemas.kafka_security import KafkaAuthorizationError, KafkaSecurity, start_client
from schemas.topics import (
    ATTEMPT_GRANTS_TOPIC,
    ATTEMPTS_TOPIC,
    DEAD_LETTER_TOPIC,
    DEFAULT_PARTITIONS,
    SCHEDULE_STATES_TOPIC,
    TARGET_BINDINGS_TOPIC,
    TENANT_ID_PATTERN,
    ensure_topics,
    occurrence_topic,
)

# Kafka's wire codes (org.apache.kafka.common.resource / acl).
_RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3}
_PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
_OPERATIONS = {"READ": 3, "WRITE": 4}
_ALLOW = 3
_ANY = 1  # a filter's wildcard (resource type, pattern type, operation, permission)
_CLUSTER_AUTHORIZATION_FAILED = 31


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may ``operation`` the ``resource_type`` ``name`` (``pattern``) from any host."""

    principal: str
    resource_type: str
    name: str
    pattern: str
    operation: str

    def kafka_acls_command(self, bootstrap: str) -> str:
        """The same rule as a ``kafka-acls.sh`` command line (what ``chronoq kafka acls`` prints)."""
        resource = "--topic" if self.resource_type == "TOPIC" else "--group"
        return shlex.join(
            [
                "kafka-acls.sh",
                "--bootstrap-server",
                bootstrap,
                "--add",
                "--allow-principal",
                self.principal,
                "--operation",
                self.operation.capitalize(),
                resource,
                self.name,
                "--resource-pattern-type",
                self.pattern.lower(),
            ]
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "resource_type": self.resource_type,
            "name": self.name,
            "pattern": self.pattern,
            "operation": self.operation,
            "permission": "ALLOW",
            "host": "*",
        }


def consumer_principal(tenant_id: str) -> str:
    """The default principal of a tenant's consumer app: ``User:<tenant>`` (its SCRAM user or certificate CN)."""
    return f"User:{tenant_id}"


def consumer_acls(
    tenant_id: str, targets: Iterable[str], principal: str | None = None, group_prefix: str | None = None
) -> list[AclBinding]:
    """The ACLs that let ``tenant_id``'s consumer app run its ``targets`` and nothing else (module docstring)."""
    if not TENANT_ID_PATTERN.fullmatch(tenant_id):
        raise ChronoqError(f"tenant {tenant_id[:70]!r} is not a tenant id")
    who = principal or consumer_principal(tenant_id)
    if not who.startswith("User:") or len(who) <= len("User:"):
        raise ChronoqError(f"principal {who!r} must look like User:<name>")
    read = [occurrence_topic(target) for target in sorted(set(targets))]
    read += [SCHEDULE_STATES_TOPIC, TARGET_BINDINGS_TOPIC, ATTEMPT_GRANTS_TOPIC]
    bindings = [AclBinding(who, "TOPIC", topic, "LITERAL", "READ") for topic in read]
    bindings.append(AclBinding(who, "GROUP", group_prefix or f"{tenant_id}.", "PREFIXED", "READ"))
    bindings += [AclBinding(who, "TOPIC", topic, "LITERAL", "WRITE") for topic in (ATTEMPTS_TOPIC, DEAD_LETTER_TOPIC)]
    return bindings


async def apply_acls(
    bootstrap: str,
    security: KafkaSecurity,
    bindings: Sequence[AclBinding],
    partitions: int = DEFAULT_PARTITIONS,
    visible_within: float = 10.0,
) -> None:
    """Create the topics the ACLs name (if missing) and the ACLs, as the principal ``security`` authenticates,
    and return once the broker enforces them (at most ``visible_within`` seconds later).

    That principal needs ALTER on the cluster (an administrator or a super user). Creating an ACL that
    exists already changes nothing, so applying twice is safe.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_options())
    await start_client(admin, bootstrap, security)
    try:
        topics = sorted({b.name for b in bindings if b.resource_type == "TOPIC"})
        await ensure_topics(admin, topics, partitions)
        for binding in bindings:
            request = CreateAclsRequest(
                _RESOURCE_TYPES[binding.resource_type],
                binding.name,
                _PATTERN_TYPES[binding.pattern],
                binding.principal,
                "*",
                _OPERATIONS[binding.operation],
                _ALLOW,
            )
            # aiokafka 0.14 has the CreateAcls request but no public admin method for it.
            response = await admin._send_request(request)
            for code, message in response.creation_responses:
                if code == _CLUSTER_AUTHORIZATION_FAILED:
                    raise KafkaAuthorizationError(
                        "the Kafka broker refused to create ACLs: the principal chronoq connects as needs ALTER"
                        " on the cluster (connect as an administrator to apply them, or run the printed"
                        " kafka-acls.sh commands)"
                    )
                if code != 0:
                    raise ChronoqError(f"the Kafka broker refused the ACL {binding.to_json()}: {message} ({code})")
        await _until_in_force(admin, topics, bindings, visible_within)
    finally:
        await admin.close()


async def _until_in_force(
    admin: AIOKafkaAdminClient, topics: Sequence[str], bindings: Sequence[AclBinding], timeout: float
) -> None:
    """Wait until the broker lists the topics and its authorizer holds the ACLs.

    Both are answered by the controller first and reach the broker's metadata cache and authorizer a
    moment later: a consumer app started right after ``--apply`` would otherwise find a topic missing
    (and be refused creating it) or an ACL not yet in force.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    wanted = {
        (_RESOURCE_TYPES[b.resource_type], b.name, _PATTERN_TYPES[b.pattern], b.principal, _OPERATIONS[b.operation])
        for b in bindings
    }
    while True:
        listed = set(await admin.list_topics())
        held: set[tuple[int, str, int, str, int]] = set()
        for principal in {b.principal for b in bindings}:
            request = DescribeAclsRequest(_ANY, None, _ANY, principal, None, _ANY, _ANY)
            response = await admin._send_request(request)
            for resource_type, name, pattern, acls in response.resources:
                held.update((resource_type, name, pattern, who, operation) for who, _host, operation, _ in acls)
        if listed.issuperset(topics) and held.issuperset(wanted):
            return
        if loop.time() > deadline:
            raise ChronoqError(f"the topics and ACLs were created but are not in force {timeout:g} s later")
        await asyncio.sleep(0.05)
