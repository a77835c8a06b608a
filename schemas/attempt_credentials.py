"""Attempt credentials: how an attempt event proves it comes from the consumer side of its target.

Issue 10 item 5. This module is the contract only (pure: no I/O); the
engine issues credentials (``engine/control/attempt_credentials.py``), its
attempt processor verifies with it (``engine/loops/attempt_authentication.py``)
and the consumer runtime signs with it (``consumers/attempt_reports.py``).

* The engine **issues** a credential per target: a random
  ``credential_id`` and a 32-byte ``secret``, stored in
  ``attempt_credentials`` (migrations 0006 and 0008) and shown to the operator once as a
  token, ``cqa_<credential_id>_<secret hex>``, which the consumer app is
  configured with (like a tenant's api token, it never travels in Kafka).
  A rotation issues a new one and keeps the old ones valid for a grace period.
* The consumer runtime **signs** every attempt event of that target: headers
  ``chronoq-credential`` (the credential id) and ``chronoq-attempt-signature``
  = hex(HMAC-SHA256(secret, ``chronoq-attempt/1`` NUL key NUL value)) over the
  exact record key and value bytes, so no canonical form is needed and a
  signature cannot be replayed under another key or on another topic's kind
  of record.
* The engine **verifies**: the credential exists and is not revoked, the
  signature matches (constant-time), the credential's target is the target of
  the occurrence the event is about. Anything else is rejected and counted (``chronoq.attempt_events_rejected``),
  never applied. A replayed genuine event is harmless: events are idempotent
  and fenced by lease tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass, field

from schemas import record_fields as fields
from schemas.errors import MalformedMessage

HEADER_CREDENTIAL = "chronoq-credential"
HEADER_SIGNATURE = "chronoq-attempt-signature"
SECRET_BYTES = 32
TOKEN_PREFIX = "cqa_"
_DOMAIN = b"chronoq-attempt/1"
_TOKEN = re.compile(r"^cqa_([0-9a-f]{32})_([0-9a-f]{64})$")


@dataclass(frozen=True)
class AttemptCredential:
    """A credential as the engine stores it and the consumer app holds it."""

    credential_id: uuid.UUID
    secret: bytes = field(repr=False)  # a log line or traceback never shows it

    @classmethod
    def issue(cls) -> AttemptCredential:
        """A fresh credential (the caller stores it with its target)."""
        return cls(uuid.uuid4(), secrets.token_bytes(SECRET_BYTES))

    @property
    def token(self) -> str:
        """The one string an operator hands to the consumer app (shown once, never logged)."""
        return f"{TOKEN_PREFIX}{self.credential_id.hex}_{self.secret.hex()}"

    @classmethod
    def from_token(cls, token: str) -> AttemptCredential:
        """Parse a token; ValueError (saying which form is expected) if it is not one."""
        match = _TOKEN.fullmatch(token.strip()) if isinstance(token, str) else None
        if match is None:
            raise ValueError(
                "an attempt credential looks like cqa_<32 hex>_<64 hex> (from chronoq target credential issue)"
            )
        return cls(uuid.UUID(hex=match[1]), bytes.fromhex(match[2]))

    def sign(self, key: bytes | None, value: bytes) -> list[tuple[str, bytes]]:
        """The headers that authenticate one attempt event record."""
        return [
            (HEADER_CREDENTIAL, str(self.credential_id).encode()),
            (HEADER_SIGNATURE, signature(self.secret, key, value).encode()),
        ]


def signature(secret: bytes, key: bytes | None, value: bytes) -> str:
    message = b"\x00".join((_DOMAIN, key or b"", value))
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SignedBy:
    """What an event's headers claim: which credential signed it, and the signature."""

    credential_id: uuid.UUID
    signature: str


def signed_by(headers: fields.Headers) -> SignedBy | None:
    """The credential claim of a record (None if unsigned), or MalformedMessage if the headers are garbled."""
    credential = fields.header_text(headers, HEADER_CREDENTIAL, 45)
    claimed = fields.header_text(headers, HEADER_SIGNATURE, 128)
    if credential is None and claimed is None:
        return None
    if credential is None or claimed is None:
        raise MalformedMessage(
            f"an attempt event needs both {HEADER_CREDENTIAL} and {HEADER_SIGNATURE}", HEADER_SIGNATURE
        )
    try:
        credential_id = uuid.UUID(credential)
    except ValueError:
        raise MalformedMessage(f"header {HEADER_CREDENTIAL!r} is not a credential id", HEADER_CREDENTIAL) from None
    return SignedBy(credential_id, claimed)


def verify(secret: bytes, key: bytes | None, value: bytes, claim: SignedBy) -> bool:
    """Constant-time check of an event's signature with the claimed credential's secret."""
    return hmac.compare_digest(signature(secret, key, value), claim.signature)
