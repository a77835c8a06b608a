"""Kafka topic naming: the one place that knows which topic carries what.

Occurrences travel on one topic per target (``chronoq.occurrences.<target>``)
keyed by schedule id: one schedule's occurrences stay in order on one
partition, and one tenant's hour-top burst spreads over every partition
instead of queueing behind itself on one (issue 12). Consumer groups scale by
partition. The engine's own streams have fixed names, except command results:
each tenant's go to its own topic (``chronoq.command-results.<tenant>``), so a
tenant reading its results never reads another tenant's, and in production an
ACL per tenant principal (READ on that one topic) enforces it. Results of
commands that name no authenticated tenant (malformed, unsigned, forged) go to
``chronoq.command-results``; they carry the command id and the reason only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import uuid
from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    for_code,
)

from schemas.errors import InvalidInput
from schemas.kafka_security import PLAINTEXT, KafkaAuthorizationError, KafkaSecurity, start_client

log = logging.getLogger("chronoq.topics")

OCCURRENCE_TOPIC_PREFIX = "chronoq.occurrences."
DEAD_LETTER_TOPIC = "chronoq.dead-letters"
COMMANDS_TOPIC = "chronoq.commands"
COMMAND_RESULTS_TOPIC = "chronoq.command-results"
ATTEMPTS_TOPIC = "chronoq.attempts"
#: The engine's answers to ``started`` (granted / refused), one partition per consumer group
#: (``schemas.attempt_grants.grant_partition``); only the engine writes it.
ATTEMPT_GRANTS_TOPIC = "chronoq.attempt-grants"
SCHEDULE_STATES_TOPIC = "chronoq.schedule-states"
TARGET_BINDINGS_TOPIC = "chronoq.target-bindings"

#: Topic-level settings chronoq applies when it creates a topic (whoever
#: creates it first: relay, engine or consumer). Schedule states are compacted:
#: a consumer reads the topic from the beginning and needs only the latest
#: state of each schedule.
TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    SCHEDULE_STATES_TOPIC: {"cleanup.policy": "compact"},
    TARGET_BINDINGS_TOPIC: {"cleanup.policy": "compact"},
}

#: How long a fetch of the engine's processors (attempt events, commands) and of the service client's command
#: results may wait at the broker for records (aiokafka's ``fetch_max_wait_ms``, default 500): someone waits on
#: each of them — a consumer app's ``started`` waits for the attempt processor's answer (the cancel barrier), a
#: caller for its command's result. Apache Kafka answers a waiting fetch as soon as a record arrives on any of
#: its partitions; tansu 0.6 does so for a fetch of one partition but answers a fetch of several only when the
#: wait runs out (~350 ms at 500: 216 ms from produce to consume, against 3 ms at 50, eight partitions;
#: docs/broker.md). At 500 a single-handler app on the embedded broker waited ~240 ms for each answer (16
#: occurrences/s at four in flight; 73-97 at 50). The price is an empty fetch twenty times a second per idle
#: reader: one per processor and engine node, so it is not paid per consumer instance — a consumer app chooses
#: its own (``ConsumerConfig.fetch_wait``; its grants reader assigns one partition, which tansu answers at once).
FETCH_WAIT_MS = 50

#: Seconds between a long-lived group consumer's metadata refreshes (aiokafka's default is five minutes). A group
#: joined while a subscribed topic is missing from the leader's metadata assigns nobody its partitions, and
#: aiokafka rejoins only once a refresh shows them: found by the suite, where `chronoq up --kafka apache`'s
#: attempt processor joined before the broker's metadata had the topic it had just created, and read nothing
#: for minutes. A refresh is one small request; the consumer apps use the same period
#: (``ConsumerConfig.metadata_refresh``).
METADATA_REFRESH_S = 5.0

#: Seconds ``ensure_topics`` waits for topics it created to be described by the broker before it returns.
TOPIC_VISIBLE_WAIT_S = 10.0

#: Partitions of the topics chronoq creates. Partitions bound a consumer
#: group's parallelism; Kafka cannot shrink them later, so err on more.
DEFAULT_PARTITIONS = 8

# Kafka allows [a-zA-Z0-9._-] up to 249 characters in a topic name; a target
# becomes part of one, so it follows the same alphabet with room for the prefix.
_TARGET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
#: A tenant id (the ``tenants`` table checks the same): it names a topic too.
TENANT_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_target(target: object) -> str:
    """Return the target if it can name a topic, else raise InvalidInput('target')."""
    if not isinstance(target, str) or not target:
        raise InvalidInput(
            "target", "is required: the name of the handler that consumes the occurrences", "billing.invoice"
        )
    if not _TARGET.match(target):
        raise InvalidInput(
            "target",
            f"{target[:120]!r} is not a valid target name: use 1-100 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit",
            "billing.invoice",
        )
    return target


def occurrence_topic(target: str) -> str:
    """The topic that carries occurrences for ``target`` (InvalidInput for anything that cannot name one).
    Memoized for text: the materializer asks once per occurrence and a consumer app once per record, for a
    few targets, and the name's check is a regex match; an invalid name raises every time (exceptions are
    not cached), and a value that is not text is checked without the cache (it may not be hashable)."""
    return OCCURRENCE_TOPIC_PREFIX + (
        _valid_text_target(target) if isinstance(target, str) else validate_target(target)
    )


_valid_text_target = functools.lru_cache(maxsize=4096)(validate_target)


def command_results_topic(tenant_id: str | None) -> str:
    """Where the results of a tenant's commands go; None (no authenticated tenant) → the shared topic."""
    if tenant_id is None:
        return COMMAND_RESULTS_TOPIC
    if not TENANT_ID_PATTERN.fullmatch(tenant_id):
        raise InvalidInput("tenant", f"{tenant_id[:70]!r} is not a tenant id", "acme")
    return f"{COMMAND_RESULTS_TOPIC}.{tenant_id}"


def placed_by_shard(topic: str) -> bool:
    """Whether the publishers place ``topic``'s records by their schedule's shard range
    (``schemas.shard_placement``): the occurrence topics. Others (schedule states, compacted by key;
    attempts; commands) keep the key's murmur2 partition."""
    return topic.startswith(OCCURRENCE_TOPIC_PREFIX)


def schedule_key(schedule_id: uuid.UUID | str) -> bytes:
    """The record key of a schedule's occurrences (and of its state messages): its id as text."""
    return str(schedule_id).encode()


async def ensure_topics(
    admin: AIOKafkaAdminClient,
    topics: Sequence[str],
    partitions: int,
    replication_factor: int = 1,
    configs: dict[str, str] | None = None,
) -> None:
    """Create the topics that do not exist; an existing topic is left as it is. Returns once the broker
    describes the created topics with their partitions (within ``TOPIC_VISIBLE_WAIT_S``): Apache Kafka accepts a
    creation before its metadata shows the topic, and a consumer group joined in that window is assigned
    nothing (``METADATA_REFRESH_S``)."""
    existing = set(await admin.list_topics())
    new = [
        NewTopic(
            t,
            num_partitions=partitions,
            replication_factor=replication_factor,
            topic_configs={**TOPIC_CONFIGS.get(t, {}), **(configs or {})},
        )
        for t in topics
        if t not in existing
    ]
    if not new:
        return
    try:
        response = await admin.create_topics(new)
    except TopicAlreadyExistsError:
        # Created by another process a moment ago: it may not be described yet either.
        await _until_described(admin, [t.name for t in new])
        return
    for topic, code, *_ in getattr(response, "topic_errors", []):
        if code == TopicAuthorizationFailedError.errno:
            # Not visible to this principal (no DESCRIBE) and not creatable by it (no CREATE): on a broker
            # with ACLs, a topic this client has no right to, whether or not it exists.
            raise KafkaAuthorizationError(
                f"the Kafka broker refused this client topic {topic} (TOPIC_AUTHORIZATION_FAILED): the"
                " principal chronoq connects as has no ACL for it; `chronoq kafka acls --tenant T` prints"
                " the ACLs a tenant's consumer app needs",
                "topic",
            )
        if code not in (0, TopicAlreadyExistsError.errno):
            # The broker's own error class (InvalidTopicError, TopicAuthorizationFailedError...), so a caller
            # can tell a topic that can never be created from a broker that is briefly unable to.
            raise for_code(code)(f"could not create topic {topic}: error code {code}")
    log.info("created topics", extra={"action": "topics.created", "topics": [t.name for t in new]})
    await _until_described(admin, [t.name for t in new])


async def _until_described(admin: AIOKafkaAdminClient, topics: list[str]) -> None:
    """Wait (at most ``TOPIC_VISIBLE_WAIT_S``) until the broker describes every one of ``topics`` with partitions;
    past that, log and return: the consumers' metadata refresh catches up later."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TOPIC_VISIBLE_WAIT_S
    pending = list(topics)
    while pending:
        try:
            described = await admin.describe_topics(pending)
        except KafkaError as err:  # best effort: the topics are created; a refresh shows them later
            log.warning(
                "could not describe the topics just created; going on",
                extra={"action": "topics.not_yet_visible", "topics": pending, "error": repr(err)},
            )
            return
        pending = [d["topic"] for d in described if d["error_code"] != 0 or not d["partitions"]]
        if not pending:
            return
        if loop.time() >= deadline:
            log.warning(
                "created topics not yet described by the broker; going on",
                extra={"action": "topics.not_yet_visible", "topics": pending},
            )
            return
        await asyncio.sleep(0.05)


async def create_missing_topics(
    bootstrap: str, topics: Sequence[str], partitions: int = DEFAULT_PARTITIONS, security: KafkaSecurity = PLAINTEXT
) -> None:
    """Connect an admin client, create the topics that do not exist, disconnect."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_options())
    await start_client(admin, bootstrap, security)
    try:
        await ensure_topics(admin, topics, partitions)
    finally:
        await admin.close()


async def topic_partitions(bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT) -> list[int]:
    """The partition numbers of ``topic``, or ``[]`` when it does not exist; never creates it.

    Asked of an admin client on purpose: aiokafka's consumer keeps metadata
    only for the topics it subscribed to, and a consumer that assigns
    partitions itself starts with an empty topic list, which Apache Kafka
    answers with no topics (tansu with all of them). So
    ``consumer.partitions_for_topic`` stays empty on Apache Kafka until the
    periodic refresh, minutes later. The existence check comes first because
    tansu creates a topic that a Metadata request names.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_options())
    await start_client(admin, bootstrap, security)
    try:
        if topic not in set(await admin.list_topics()):
            return []
        (description,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if description["error_code"] == UnknownTopicOrPartitionError.errno:
        return []  # listed a moment ago, not yet known to the broker that answered: created just now
    if description["error_code"] != 0:
        raise KafkaError(f"could not describe topic {topic}: error code {description['error_code']}")
    return sorted(partition["partition"] for partition in description["partitions"])
