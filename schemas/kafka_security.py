"""How every chronoq Kafka client authenticates and encrypts: one typed config, one place that turns it into
aiokafka's keyword arguments, and one start-up check that fails fast on a refused credential.

Every producer, consumer and admin client of the project (relay publisher,
engine processors, consumer runtime and its views, service client, CLI) is
built with ``**security.client_options()``, so a cluster that requires TLS
or SASL is reached the same way by all of them. Library users put a
:class:`KafkaSecurity` in their config dataclass; the CLI reads it from the
``CHRONOQ_KAFKA_*`` environment (``engine/cli/endpoints.py``).

Secrets: the SASL password is not part of ``repr()`` (nor of :meth:`describe`,
which is what ``chronoq status`` prints), and no error raised here contains it.

Fail fast: aiokafka logs the real reason a bootstrap failed (a refused
password, a certificate it does not trust) and raises only "Unable to
bootstrap", which every chronoq loop treats as an outage and retries forever.
:func:`start_client` starts a client and, when it cannot bootstrap, connects
once more by hand to find out why; a refused credential or certificate is a
:class:`KafkaSecurityError` (not transient, its message says what to fix),
anything else stays the transient connection error it was.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.helpers import create_ssl_context

from schemas import observability as obs
from schemas.errors import ChronoqError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaSecurityError(ChronoqError):
    """The broker refused chronoq's credentials or certificate, or chronoq refused the broker's certificate.

    Not transient: the same connection fails the same way until the configuration (or the broker's users,
    certificates or ACLs) changes, so loops stop instead of retrying it. ``field`` names the
    ``CHRONOQ_KAFKA_*`` setting most likely at fault.
    """

    code = "kafka_security"
    http_status = 502

    def __init__(self, field: str | None, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(problem)


class KafkaAuthorizationError(ChronoqError):
    """The broker's ACLs refuse this principal an operation (read a topic, join a group, write a topic).

    Not transient: waiting does not grant an ACL. The message names the principal's resource and the
    command that prints the ACLs a consumer app needs.
    """

    code = "kafka_authorization"
    http_status = 403

    def __init__(self, problem: str, resource: str | None = None) -> None:
        self.problem = problem
        self.resource = resource  # "topic", "consumer group", "cluster" when known
        super().__init__(problem)


#: aiokafka's errors for an ACL refusal (none is retriable in aiokafka either).
AUTHORIZATION_ERRORS: tuple[type[kafka_errors.KafkaError], ...] = (
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.TransactionalIdAuthorizationFailed,
)


def refused(err: kafka_errors.KafkaError) -> KafkaAuthorizationError:
    """aiokafka's ACL refusal (one of :data:`AUTHORIZATION_ERRORS`) as a :class:`KafkaAuthorizationError`."""
    what = {
        kafka_errors.TopicAuthorizationFailedError: "topic",
        kafka_errors.GroupAuthorizationFailedError: "consumer group",
        kafka_errors.ClusterAuthorizationFailedError: "cluster",
    }.get(type(err), "resource")
    names = ", ".join(str(arg) for arg in err.args) or "?"
    _count_refusal("authorization", what)
    return KafkaAuthorizationError(
        f"the Kafka broker's ACLs refuse this principal the {what} {names} ({type(err).__name__}); an"
        " operator grants a tenant's consumer app what it needs with `chronoq kafka acls --tenant T --apply`",
        what,
    )


@dataclass(frozen=True)
class KafkaSecurity:
    """protocol: ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
    sasl_mechanism: ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` (SASL protocols only; default PLAIN).
    sasl_username / sasl_password: the SASL user (required with a SASL protocol). The password is never
        part of ``repr()`` or :meth:`describe`.
    ssl_cafile: PEM file of the CA(s) that signed the broker's certificate (default: the system's CAs).
    ssl_certfile / ssl_keyfile: this client's PEM certificate (chain) and unencrypted private key, for a
        listener that requires client certificates (mutual TLS); the key may also be inside the certfile.
    ssl_check_hostname: verify that the broker's certificate names the host connected to (default True;
        turn it off only for a broker reached by an address its certificate does not list).
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def validate(self) -> None:
        """Cross-field rules; a :class:`KafkaSecurityError` naming the setting at fault."""
        if self.protocol not in SECURITY_PROTOCOLS:
            raise KafkaSecurityError(
                "security_protocol", f"{self.protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        if self.uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise KafkaSecurityError(
                    "sasl_mechanism", f"{self.sasl_mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise KafkaSecurityError(
                    "sasl_username", f"{self.protocol} needs a SASL username and password ({self.sasl_mechanism})"
                )
        if not self.uses_ssl and (self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile):
            raise KafkaSecurityError(
                "security_protocol", f"SSL files are set but the protocol is {self.protocol}: use SSL or SASL_SSL"
            )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise KafkaSecurityError("ssl_certfile", "a client key needs its certificate (ssl_certfile)")

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments every aiokafka producer, consumer and admin client of chronoq is built with."""
        self.validate()
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_ssl:
            options["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password
        return options

    def librdkafka_options(self) -> dict[str, Any]:
        """The same security as librdkafka configuration properties (the data plane's publisher,
        ``relay/librdkafka_publisher.py``), from the same validated fields."""
        self.validate()
        options: dict[str, Any] = {"security.protocol": self.protocol.lower()}
        if self.uses_ssl:
            if self.ssl_cafile:
                options["ssl.ca.location"] = self.ssl_cafile
            if self.ssl_certfile:
                options["ssl.certificate.location"] = self.ssl_certfile
            if self.ssl_keyfile:
                options["ssl.key.location"] = self.ssl_keyfile
            options["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_check_hostname else "none"
        if self.uses_sasl:
            options["sasl.mechanism"] = self.sasl_mechanism
            options["sasl.username"] = self.sasl_username
            options["sasl.password"] = self.sasl_password
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying TLS context from the CA, client certificate and key files (a clear error if unreadable)."""
        try:
            context = create_ssl_context(cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile)
        except FileNotFoundError:
            name, path = _missing_file(self)
            raise KafkaSecurityError(name, f"cannot read {path}: no such file") from None
        except (ssl.SSLError, OSError) as err:
            # ssl's messages name the PEM problem, never a file's contents.
            raise KafkaSecurityError("ssl_certfile", f"cannot load the TLS files: {err}") from None
        context.check_hostname = self.ssl_check_hostname
        return context

    def describe(self) -> str:
        """One line for ``chronoq status`` and logs: the protocol, mechanism, user and files, never the password."""
        parts = [self.protocol]
        if self.uses_sasl:
            parts.append(f"{self.sasl_mechanism} user {self.sasl_username}")
        if self.uses_ssl:
            parts.append(f"CA {self.ssl_cafile or 'system'}")
            if self.ssl_certfile:
                parts.append(f"client certificate {self.ssl_certfile}")
            if not self.ssl_check_hostname:
                parts.append("hostname not checked")
        return ", ".join(parts)


PLAINTEXT = KafkaSecurity()


def _missing_file(security: KafkaSecurity) -> tuple[str, str]:
    """The first configured TLS file that does not exist, as (field, path); ssl's error does not say which."""
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(security, name)
        if path and not os.path.exists(path):
            return name, path
    return "ssl_cafile", "a TLS file"


class Startable(Protocol):
    """A Kafka client (or publisher) that connects in ``start()``."""

    async def start(self) -> None: ...


async def start_client(client: Startable, bootstrap: str, security: KafkaSecurity) -> None:
    """``await client.start()``; when it cannot bootstrap, raise :class:`KafkaSecurityError` if the reason is
    a refused credential or certificate (see the module docstring), else the transient error it was.
    A client whose start failed is closed (stopping it again is harmless)."""
    try:
        await client.start()
    except kafka_errors.KafkaConnectionError:
        await _close_quietly(client)
        refusal = await security_refusal(bootstrap, security)
        if refusal is not None:
            _count_refusal("authentication", refusal.field or "")
            # No log line of its own: the error is raised to whoever started the client, which reports it.
            raise refusal from None
        raise
    except BaseException:
        await _close_quietly(client)
        raise


@asynccontextmanager
async def closed_on_failure(client: object) -> AsyncIterator[None]:
    """The steps that follow a client's start (an assignment, a seek, a topic lookup) before it is handed over:
    if one fails (the broker went away meanwhile), the client is closed and that step's error raised. Nobody
    else holds the client yet, and a caller that retries makes a new one each time (aiokafka warns about each
    one left unclosed when it is collected)."""
    try:
        yield
    except BaseException:
        await _close_quietly(client)
        raise


def _count_refusal(kind: str, setting: str) -> None:
    obs.get_meter("kafka").create_counter(obs.KAFKA_REFUSALS, unit="1").add(1, {"kind": kind, "setting": setting})


async def _close_quietly(client: object) -> None:
    """Release a client whose start (or a step right after it) failed; aiokafka warns about an unclosed one when
    it is collected."""
    close = getattr(client, "stop", None) or getattr(client, "close", None)
    if close is None:
        return
    try:
        await close()
    except Exception:  # noqa: BLE001, S110 - the failed step's error is the one to report
        pass


async def security_refusal(bootstrap: str, security: KafkaSecurity, timeout: float = 10.0) -> KafkaSecurityError | None:
    """Connect to each bootstrap server once; the :class:`KafkaSecurityError` if the TLS handshake or SASL
    authentication was refused, None if a server was reachable and accepted us, or was unreachable (an outage)."""
    for server in bootstrap.split(","):
        outcome = await _probe(server.strip(), security, timeout)
        if outcome is not _UNREACHABLE:
            return outcome
    return None


#: :func:`_probe`'s answer for a server it could not reach (then the next one is tried).
_UNREACHABLE = KafkaSecurityError(None, "unreachable")


async def _probe(server: str, security: KafkaSecurity, timeout: float, attempt: int = 0) -> KafkaSecurityError | None:
    """One connection to ``server``: the refusal, None if it accepted us, or :data:`_UNREACHABLE`."""
    host, _, port = server.rpartition(":")
    try:
        async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancellation (Python 3.11)
            conn = await create_conn(
                host.strip("[]"),
                int(port),
                ssl_context=security.client_options().get("ssl_context"),
                security_protocol=security.protocol,
                sasl_mechanism=security.sasl_mechanism,
                sasl_plain_username=security.sasl_username,
                sasl_plain_password=security.sasl_password,
            )
    except ssl.SSLCertVerificationError as err:
        return KafkaSecurityError(
            "ssl_cafile",
            f"the Kafka broker {server}'s TLS certificate is not trusted ({err.verify_message});"
            " set CHRONOQ_KAFKA_SSL_CAFILE to the CA that signed it"
            + (" (or, for a name mismatch, CHRONOQ_KAFKA_SSL_CHECK_HOSTNAME=0)" if "hostname" in str(err) else ""),
        )
    except ssl.SSLError as err:
        return KafkaSecurityError(
            "ssl_certfile",
            f"the TLS handshake with the Kafka broker {server} failed ({err.reason or err}): the broker may"
            " require a client certificate (CHRONOQ_KAFKA_SSL_CERTFILE / _KEYFILE) signed by a CA it trusts",
        )
    except (
        kafka_errors.SaslAuthenticationFailed,
        kafka_errors.AuthenticationFailedError,
        kafka_errors.IllegalSaslStateError,
    ) as err:
        return KafkaSecurityError(
            "sasl_password",
            f"the Kafka broker {server} refused SASL {security.sasl_mechanism} authentication of user"
            f" {security.sasl_username!r}: {_without(err, security.sasl_password)} (check"
            " CHRONOQ_KAFKA_SASL_USERNAME / _PASSWORD / _MECHANISM)",
        )
    except kafka_errors.UnsupportedSaslMechanismError as err:
        return KafkaSecurityError(
            "sasl_mechanism",
            f"the Kafka broker {server} does not offer SASL {security.sasl_mechanism}:"
            f" {_without(err, security.sasl_password)}",
        )
    except ConnectionResetError:
        # A plain-text listener that received our TLS ClientHello reads its first bytes as a huge
        # request size and drops the connection. Once could be a broker going down: look twice.
        if not security.uses_ssl:
            return _UNREACHABLE
        if attempt == 0:
            await asyncio.sleep(0.2)
            return await _probe(server, security, timeout, attempt=1)
        return KafkaSecurityError(
            "security_protocol",
            f"the Kafka broker {server} drops the connection during the TLS handshake: this listener may not"
            " speak TLS (CHRONOQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT or SASL_PLAINTEXT, or another port)",
        )
    except kafka_errors.KafkaConnectionError as err:
        return _closed_connection(server, security, err)
    except (OSError, TimeoutError, kafka_errors.KafkaError):
        return _UNREACHABLE  # unreachable or unanswered: an outage, not a refusal
    conn.close()
    return None


def _closed_connection(
    server: str, security: KafkaSecurity, err: kafka_errors.KafkaConnectionError
) -> KafkaSecurityError:
    """Why the broker closed a connection it had accepted, if the bytes say (else :data:`_UNREACHABLE`)."""
    if not security.uses_ssl and _answered_in_tls(err):
        return KafkaSecurityError(
            "security_protocol",
            f"the Kafka broker {server} answers in TLS: this listener needs"
            " CHRONOQ_KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL",
        )
    # Under TLS 1.3 the server checks the client's certificate after the client considers the
    # handshake done: a refusal shows on the first request (aiokafka's version lookup), as a
    # closed connection caused by the server's TLS alert.
    alert = _tls_alert(err)
    if security.uses_ssl and alert:
        return KafkaSecurityError(
            "ssl_certfile",
            f"the Kafka broker {server} refused this client's TLS certificate ({alert}): it requires a"
            " client certificate (CHRONOQ_KAFKA_SSL_CERTFILE / _KEYFILE) signed by a CA it trusts",
        )
    return _UNREACHABLE


def _answered_in_tls(err: BaseException) -> bool:
    """Whether a plain-text read failed on a TLS record: the 4-byte size prefix aiokafka read was a TLS
    record header (content type 0x15 alert or 0x16 handshake, then version 0x03 0x0N)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, asyncio.IncompleteReadError) and seen.expected is not None:
            return (seen.expected >> 16) in (0x1503, 0x1603)
        seen = seen.__cause__ or seen.__context__
    return False


def _tls_alert(err: BaseException) -> str | None:
    """The TLS alert behind a connection error (``TLSV13_ALERT_CERTIFICATE_REQUIRED``...), if there is one."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return str(seen.reason or seen)
        seen = seen.__cause__ or seen.__context__
    return None


def _without(err: BaseException, secret: str | None) -> str:
    text = str(err)
    return text.replace(secret, "***") if secret else text
