"""KafkaSecurity (schemas/kafka_security.py), its CLI environment (engine/cli/endpoints.py) and the consumer
ACLs (engine/control/kafka_acls.py): no broker needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli.endpoints import kafka_security_setting, redacted_url
from engine.control.kafka_acls import consumer_acls
from schemas.errors import ChronoqError, StackError
from schemas.kafka_security import PLAINTEXT, KafkaSecurity, KafkaSecurityError
from schemas.topics import ATTEMPTS_TOPIC, COMMANDS_TOPIC, DEAD_LETTER_TOPIC, SCHEDULE_STATES_TOPIC
from tests.support.certificates import CertificateAuthority

SECRET = "s3cr3t-never-printed"


def test_plaintext_adds_nothing_but_the_protocol() -> None:
    assert PLAINTEXT.client_options() == {"security_protocol": "PLAINTEXT"}


def test_sasl_ssl_gives_aiokafka_a_verifying_context_and_the_credentials(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    security = KafkaSecurity("SASL_SSL", "SCRAM-SHA-256", "billing", SECRET, ssl_cafile=str(ca.cafile))
    options = security.client_options()
    assert options["security_protocol"] == "SASL_SSL" and options["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("billing", SECRET)
    assert options["ssl_context"].check_hostname and options["ssl_context"].verify_mode.name == "CERT_REQUIRED"
    unchecked = KafkaSecurity("SSL", ssl_cafile=str(ca.cafile), ssl_check_hostname=False)
    assert not unchecked.client_options()["ssl_context"].check_hostname


def test_the_password_is_in_neither_repr_nor_the_description() -> None:
    security = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "billing", SECRET)
    assert SECRET not in repr(security) and SECRET not in security.describe()
    assert security.describe() == "SASL_SSL, SCRAM-SHA-512 user billing, CA system"


@pytest.mark.parametrize(
    "security, field",
    [
        (KafkaSecurity("TLS"), "security_protocol"),
        (KafkaSecurity("SASL_SSL", "GSSAPI", "u", "p"), "sasl_mechanism"),
        (KafkaSecurity("SASL_SSL", "PLAIN", None, SECRET), "sasl_username"),
        (KafkaSecurity("PLAINTEXT", ssl_cafile="/ca.pem"), "security_protocol"),
        (KafkaSecurity("SSL", ssl_keyfile="/client.key"), "ssl_certfile"),
        (KafkaSecurity("SSL", ssl_cafile="/no/such/ca.pem"), "ssl_cafile"),
    ],
)
def test_an_inconsistent_configuration_names_its_field_and_not_the_password(security, field) -> None:
    with pytest.raises(KafkaSecurityError) as refused:
        security.client_options()
    assert refused.value.field == field and SECRET not in str(refused.value)


def test_the_cli_reads_security_from_the_environment(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    client = ca.issue_client("billing")
    env = {
        "CHRONOQ_KAFKA_SECURITY_PROTOCOL": "ssl",
        "CHRONOQ_KAFKA_SSL_CAFILE": str(ca.cafile),
        "CHRONOQ_KAFKA_SSL_CERTFILE": str(client.certfile),
        "CHRONOQ_KAFKA_SSL_KEYFILE": str(client.keyfile),
        "CHRONOQ_KAFKA_SSL_CHECK_HOSTNAME": "0",
    }
    assert kafka_security_setting(env) == KafkaSecurity(
        "SSL",
        ssl_cafile=str(ca.cafile),
        ssl_certfile=str(client.certfile),
        ssl_keyfile=str(client.keyfile),
        ssl_check_hostname=False,
    )
    sasl = {
        "CHRONOQ_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "CHRONOQ_KAFKA_SASL_MECHANISM": "scram-sha-512",
        "CHRONOQ_KAFKA_SASL_USERNAME": "billing",
        "CHRONOQ_KAFKA_SASL_PASSWORD": f" {SECRET} ",
    }
    assert kafka_security_setting(sasl) == KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", "billing", f" {SECRET} ")
    assert kafka_security_setting({}) == PLAINTEXT


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"CHRONOQ_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CHRONOQ_KAFKA_SASL_PASSWORD": SECRET}, "_SASL_USERNAME"),
        ({"CHRONOQ_KAFKA_SECURITY_PROTOCOL": "SSL", "CHRONOQ_KAFKA_SSL_CAFILE": "/no/such.pem"}, "_SSL_CAFILE"),
        ({"CHRONOQ_KAFKA_SECURITY_PROTOCOL": "KERBEROS", "CHRONOQ_KAFKA_SASL_PASSWORD": SECRET}, "_SECURITY_PROTOCOL"),
        ({"CHRONOQ_KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "_SSL_CHECK_HOSTNAME"),
    ],
)
def test_a_bad_environment_names_the_variable_and_never_the_password(env, variable) -> None:
    with pytest.raises(StackError) as refused:
        kafka_security_setting(env)
    assert f"CHRONOQ_KAFKA{variable}" in str(refused.value) and SECRET not in str(refused.value)


def test_printed_database_urls_hide_their_password() -> None:
    assert redacted_url(f"postgresql://app:{SECRET}@db:5432/chronoq?sslmode=require") == (
        "postgresql://app:***@db:5432/chronoq?sslmode=require"
    )
    assert redacted_url("postgresql://app@db/chronoq") == "postgresql://app@db/chronoq"


def test_a_tenants_consumer_acls_read_only_its_targets_and_write_only_attempts_and_dead_letters() -> None:
    acls = consumer_acls("acme", ["billing.invoice", "billing.dunning"])
    assert {a.principal for a in acls} == {"User:acme"}
    reads = {(a.resource_type, a.name, a.pattern) for a in acls if a.operation == "READ"}
    assert reads == {
        ("TOPIC", "chronoq.occurrences.billing.dunning", "LITERAL"),
        ("TOPIC", "chronoq.occurrences.billing.invoice", "LITERAL"),
        ("TOPIC", SCHEDULE_STATES_TOPIC, "LITERAL"),
        ("TOPIC", "chronoq.target-bindings", "LITERAL"),
        ("TOPIC", "chronoq.attempt-grants", "LITERAL"),  # read, never written: only the engine answers
        ("GROUP", "acme.", "PREFIXED"),
    }
    writes = {a.name for a in acls if a.operation == "WRITE"}
    assert writes == {ATTEMPTS_TOPIC, DEAD_LETTER_TOPIC} and COMMANDS_TOPIC not in writes
    assert "--operation Read --topic chronoq.occurrences.billing.invoice" in acls[1].kafka_acls_command("k:9093")
    other = consumer_acls("globex", ["crm.sync"], principal="User:CN=globex-app", group_prefix="crm-")
    assert {a.principal for a in other} == {"User:CN=globex-app"} and ("GROUP", "crm-", "PREFIXED") in {
        (a.resource_type, a.name, a.pattern) for a in other
    }
    with pytest.raises(ChronoqError, match="tenant"):
        consumer_acls("Not A Tenant", [])
