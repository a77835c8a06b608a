"""Attempt credentials (issue 10 item 5, the contract only): tokens, signatures, garbled headers."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.attempt_credentials import (
    HEADER_CREDENTIAL,
    HEADER_SIGNATURE,
    AttemptCredential,
    signed_by,
    verify,
)
from schemas.errors import MalformedMessage

KEY, VALUE = b"6f1c2a0e-4d0b-5c8e-9a51-63686f6e6f71", b'{"format": 1, "event": "succeeded"}'


def test_a_token_round_trips_and_a_signature_verifies_only_for_its_record():
    credential = AttemptCredential.issue()
    assert AttemptCredential.from_token(credential.token) == credential
    claim = signed_by(credential.sign(KEY, VALUE))
    assert claim is not None and claim.credential_id == credential.credential_id
    assert verify(credential.secret, KEY, VALUE, claim)
    assert not verify(credential.secret, b"another-occurrence", VALUE, claim)  # moved to another key
    assert not verify(credential.secret, KEY, VALUE + b" ", claim)  # value changed
    assert not verify(AttemptCredential.issue().secret, KEY, VALUE, claim)  # another credential's secret


def test_an_unsigned_record_claims_nothing():
    assert signed_by([]) is None and signed_by(None) is None


@pytest.mark.parametrize(
    "headers",
    [
        [(HEADER_CREDENTIAL, str(uuid.uuid4()).encode())],  # signature missing
        [(HEADER_SIGNATURE, b"00")],  # credential missing
        [(HEADER_CREDENTIAL, b"not-a-uuid"), (HEADER_SIGNATURE, b"00")],
        [(HEADER_CREDENTIAL, b"\xff"), (HEADER_SIGNATURE, b"00")],
    ],
)
def test_garbled_credential_headers_are_a_rejection(headers):
    with pytest.raises(MalformedMessage):
        signed_by(headers)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([HEADER_CREDENTIAL, HEADER_SIGNATURE, "x"]), st.one_of(st.none(), st.binary(max_size=80))
        ),
        max_size=4,
    )
)
def test_any_headers_give_a_claim_none_or_a_rejection(headers):
    try:
        claim = signed_by(headers)
    except MalformedMessage:
        return
    if claim is not None:
        assert not verify(AttemptCredential.issue().secret, KEY, VALUE, claim)


@pytest.mark.parametrize("token", ["", "cqa_x", "cq_" + "0" * 97, None, "cqa_" + "0" * 32 + "_" + "g" * 64])
def test_a_malformed_token_is_refused_with_the_expected_form(token):
    with pytest.raises(ValueError, match="cqa_"):
        AttemptCredential.from_token(token)
