"""A throwaway certificate authority for the secure-broker tests: a CA, a server certificate for 127.0.0.1 and
localhost, and client certificates whose common name is the Kafka principal (``User:<CN>``).

Keys are EC P-256 (fast to generate: the whole set takes milliseconds) written as unencrypted PKCS#8 PEM,
which both Apache Kafka's PEM key store and Python's ssl module load. Nothing leaves the test's directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class IssuedCertificate:
    """PEM files of one certificate: ``certfile`` (the certificate), ``keyfile`` (its key) and ``bundle``
    (key then certificate, the form Apache Kafka's PEM key store reads)."""

    certfile: Path
    keyfile: Path
    bundle: Path


class CertificateAuthority:
    """A self-signed CA in ``directory`` (``<name>-ca.pem``) that issues server and client certificates."""

    def __init__(self, directory: Path, name: str = "chronoq-test") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.name = name
        self.cafile = directory / f"{name}-ca.pem"
        self.cafile.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))

    def issue_server(self, name: str) -> IssuedCertificate:
        """A server certificate for 127.0.0.1 and localhost."""
        alt_names = x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        return self._issue(name, ExtendedKeyUsageOID.SERVER_AUTH, alt_names)

    def issue_client(self, common_name: str) -> IssuedCertificate:
        """A client certificate whose subject is ``CN=<common_name>`` (the broker maps it to ``User:<common_name>``)."""
        return self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)

    def _issue(
        self, common_name: str, usage: x509.ObjectIdentifier, alt_names: x509.SubjectAlternativeName | None
    ) -> IssuedCertificate:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        if alt_names is not None:
            builder = builder.add_extension(alt_names, critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        stem = self.directory / f"{self.name}-{common_name}"
        files = IssuedCertificate(Path(f"{stem}.crt"), Path(f"{stem}.key"), Path(f"{stem}-bundle.pem"))
        files.certfile.write_bytes(cert_pem)
        files.keyfile.write_bytes(key_pem)
        files.keyfile.chmod(0o600)
        files.bundle.write_bytes(key_pem + cert_pem)
        files.bundle.chmod(0o600)
        return files
