"""TLS to PostgreSQL: asyncpg takes libpq's ``sslmode`` (and ``sslrootcert``) in the database URL, so every
chronoq database URL (CHRONOQ_DATABASE_URL, CHRONOQ_CONSUMER_DATABASE_URL, ConsumerConfig.database_url)
can require TLS and verify the server (docs/operations.md). The embedded PostgreSQL cannot terminate TLS
(its build has no OpenSSL): a TLS front in PostgreSQL's own negotiation stands before it
(tests/support/postgres_tls_front.py)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from engine.loops.service import migrate
from schemas.connections import create_pool
from tests.support.certificates import CertificateAuthority
from tests.support.databases import Servers, create_database, drop_database
from tests.support.postgres_tls_front import PostgresTlsFront


@pytest.fixture
async def tls_front(servers: Servers, tmp_path: Path) -> AsyncIterator[PostgresTlsFront]:
    front = PostgresTlsFront(servers.admin_url, CertificateAuthority(tmp_path / "tls"))
    await front.start()
    yield front
    await front.stop()


async def test_sslmode_in_a_database_url_encrypts_and_verifies_the_server(servers, tls_front, tmp_path) -> None:
    name = "chronoq_tls_test"
    await drop_database(servers, name)
    await create_database(servers, name)
    try:
        # require: encrypted, the certificate not checked (libpq's meaning).
        conn = await asyncpg.connect(tls_front.url(name, sslmode="require"))
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
        # verify-full with the CA: chronoq's own migration and pool, end to end.
        verified = tls_front.url(name, sslmode="verify-full", sslrootcert=str(tls_front.ca.cafile))
        assert "0001_core" in await migrate(verified)
        pool = await create_pool(verified, min_size=1, max_size=2)
        try:
            assert await pool.fetchval("SELECT count(*) FROM tenants") == 0
        finally:
            await pool.close()
        assert tls_front.handshakes >= 3 and tls_front.refused == 0
        # A server certificate from a CA the URL does not trust: refused by the client.
        stranger = CertificateAuthority(tmp_path / "stranger", "stranger")
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncpg.connect(tls_front.url(name, sslmode="verify-full", sslrootcert=str(stranger.cafile)))
        # sslmode=disable: no TLS asked for, so the front (like a hostssl-only server) lets nothing through.
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await asyncpg.connect(tls_front.url(name, sslmode="disable"))
        assert tls_front.refused == 1
    finally:
        await drop_database(servers, name)
