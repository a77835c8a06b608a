"""Which publish errors make the relay give up on a row (relay/publish_refusals.py): only refusals about the
row itself; a transient failure, or one about the relay, must never turn into dead occurrences."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    KafkaConnectionError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    PolicyViolationError,
    RecordListTooLargeError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)

from relay.publish_refusals import RecordTooLarge, refusal_reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (MessageSizeTooLargeError(), "too_large"),
        (RecordListTooLargeError(), "too_large"),
        (RecordTooLarge("40000 bytes"), "too_large"),
        (InvalidTopicError(), "invalid_topic"),
        (TopicAuthorizationFailedError(), "unauthorized_topic"),
        (PolicyViolationError(), "refused"),
        # Transient, or about the relay rather than the row: retried without limit, never quarantined.
        (TimeoutError("no acknowledgement within ack_timeout: outcome unknown"), None),
        (KafkaConnectionError(), None),
        (RequestTimedOutError(), None),
        (NotLeaderForPartitionError(), None),
        (ClusterAuthorizationFailedError(), None),
        (UnsupportedVersionError(), None),
        (UnknownTopicOrPartitionError(), None),  # retriable: the topic may be being created
        (None, None),
    ],
)
def test_only_refusals_about_the_row_itself_count_towards_quarantine(error, reason):
    assert refusal_reason(error) == reason
