"""Publish refusals: which publish errors are about the row itself, so retrying it cannot help.

Guarantee: :func:`refusal_reason` names a reason only for an error the
broker (or the producer, before sending) gives because of the record or its
topic — too large, an invalid topic name, a topic this relay may not write
or create, or another non-retriable broker answer about the request. Those
rows are quarantined after a bounded number of tries
(:mod:`relay.dispatcher`). Everything else — a broker away, a timeout, an
unknown outcome, a leader moving, the relay's own cluster-wide
authorization — is transient: the row is retried for as long as it takes,
never given up on, because nothing about the row is wrong.
"""

from __future__ import annotations

from aiokafka.errors import (
    BrokerResponseError,
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnsupportedVersionError,
)

from schemas.kafka_security import KafkaAuthorizationError

TOO_LARGE = "too_large"
INVALID_TOPIC = "invalid_topic"
UNAUTHORIZED_TOPIC = "unauthorized_topic"
REFUSED = "refused"


class RecordTooLarge(KafkaError):
    """The record alone exceeds the publisher's batch limit: no broker would take it."""

    retriable = False


# Broker answers that are about the relay or the cluster, not the row: retried, never quarantined.
_NOT_THE_ROWS_FAULT = (ClusterAuthorizationFailedError, UnsupportedVersionError)


def refusal_reason(error: BaseException | None) -> str | None:
    """Why no retry of this row can succeed, or None if the failure is (or may be) transient."""
    if isinstance(error, (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLarge)):
        return TOO_LARGE
    if isinstance(error, InvalidTopicError):
        return INVALID_TOPIC
    if isinstance(error, TopicAuthorizationFailedError):
        return UNAUTHORIZED_TOPIC
    if isinstance(error, KafkaAuthorizationError) and error.resource == "topic":
        return UNAUTHORIZED_TOPIC  # a topic this relay may not create (schemas.topics.ensure_topics)
    if isinstance(error, BrokerResponseError) and not error.retriable and not isinstance(error, _NOT_THE_ROWS_FAULT):
        return REFUSED
    return None
