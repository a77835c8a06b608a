"""An Apache Kafka broker as production secures one: SASL_SSL with SCRAM users, mutual TLS, and ACLs.

Three listeners on free loopback ports:

* ``PLAINTEXT``: the broker's own (controller and inter-broker) and the test's admin; its principal,
  ``User:ANONYMOUS``, is a super user, as an operator's out-of-band admin access would be;
* ``SASL_SSL``: TLS with the test CA's server certificate, SCRAM-SHA-256 and -512, users created at
  format time (``--add-scram``): ``admin`` (super user) and one user per tenant;
* ``SSL``: TLS that *requires* a client certificate signed by the test CA (mutual TLS); the principal is
  the certificate's common name (``ssl.principal.mapping.rules``): ``engine`` is a super user.

The StandardAuthorizer is on with no ACLs, so any other principal may do nothing until
``chronoq kafka acls`` grants it something.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from engine.cli.embedded.apache_kafka import ApacheKafka
from schemas.kafka_security import KafkaSecurity
from tests.support.brokers import BROKER_TEST_OVERRIDES
from tests.support.certificates import CertificateAuthority

SASL_LISTENER = "SASL_SSL"
MTLS_LISTENER = "SSL"
SUPER_USER = "admin"
ENGINE_CN = "engine"
#: Tenants with a SCRAM user of their own name (the consumer principal ``User:<tenant>``).
TENANT_USERS = ("tenant-a", "tenant-b")


@dataclass
class SecureKafka:
    """The running broker, its CA and its users' passwords (see the module docstring)."""

    broker: ApacheKafka
    ca: CertificateAuthority
    untrusted_ca: CertificateAuthority
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def plaintext_bootstrap(self) -> str:
        assert self.broker.bootstrap is not None
        return self.broker.bootstrap

    @property
    def sasl_bootstrap(self) -> str:
        return self.broker.listener_bootstrap(SASL_LISTENER)

    @property
    def mtls_bootstrap(self) -> str:
        return self.broker.listener_bootstrap(MTLS_LISTENER)

    def scram(self, user: str, mechanism: str = "SCRAM-SHA-512", password: str | None = None) -> KafkaSecurity:
        """SASL_SSL as ``user`` (its real password unless ``password`` says otherwise), trusting the test CA."""
        return KafkaSecurity(
            protocol="SASL_SSL",
            sasl_mechanism=mechanism,
            sasl_username=user,
            sasl_password=self.passwords[user] if password is None else password,
            ssl_cafile=str(self.ca.cafile),
        )

    def mtls(self, common_name: str, *, client_ca: CertificateAuthority | None = None) -> KafkaSecurity:
        """SSL with a client certificate for ``common_name`` issued by ``client_ca`` (default: the test CA)."""
        issued = (client_ca or self.ca).issue_client(common_name)
        return KafkaSecurity(
            protocol="SSL",
            ssl_cafile=str(self.ca.cafile),
            ssl_certfile=str(issued.certfile),
            ssl_keyfile=str(issued.keyfile),
        )


def secure_broker_properties(ca: CertificateAuthority) -> dict[str, str]:
    """The broker properties of the secure listeners and the authorizer (the module docstring says why)."""
    server = ca.issue_server("broker")
    scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.bundle),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.cafile),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram_module,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_module,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:ANONYMOUS;User:{SUPER_USER};User:{ENGINE_CN}",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
    }


def prepare_secure_kafka(base: Path) -> SecureKafka:
    """A (not yet started) secure broker in ``base``: certificates and passwords generated now."""
    ca = CertificateAuthority(base / "tls", "chronoq-test")
    untrusted = CertificateAuthority(base / "tls", "stranger")
    passwords = {user: secrets.token_urlsafe(18) for user in (SUPER_USER, *TENANT_USERS)}
    scram_users = [
        f"{mechanism}=[name={user},password={password}]"
        for user, password in passwords.items()
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
    ]
    broker = ApacheKafka(
        base / "kafka",
        overrides={**BROKER_TEST_OVERRIDES, **secure_broker_properties(ca)},
        listeners={SASL_LISTENER: "SASL_SSL", MTLS_LISTENER: "SSL"},
        scram_users=scram_users,
    )
    return SecureKafka(broker, ca, untrusted, passwords)
