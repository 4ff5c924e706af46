"""PostgreSQL over TLS with verify-full: the server's and coordinator's connections
check the database's certificate and name, through the URL (sslmode, sslrootcert)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import trustme
from certs import write_ca, write_leaf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from awp_common.tls import ClientTls, channel
from awp_db.connect import connect
from awp_db.migrate import migrate
from awp_server import app
from awp_server.config import ServerConfig
from kit import poll_until
from kit.system_postgres import SystemPostgres


@pytest.fixture(scope="module")
def database_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_postgres(database_ca: trustme.CA) -> Iterator[SystemPostgres]:
    """A PostgreSQL of its own that serves TLS with a certificate for 127.0.0.1 (the
    embedded one is built without SSL)."""
    postgres = SystemPostgres().init()
    pem = write_leaf(database_ca.issue_cert("127.0.0.1"), postgres.root, "server")
    for name in (pem.cert, pem.key):
        # PostgreSQL reads its key only when its own user owns it, unreadable by others.
        postgres.own(Path(name))
    postgres.settings = ("ssl=on", f"ssl_cert_file={pem.cert}", f"ssl_key_file={pem.key}")
    postgres.start()
    yield postgres
    postgres.stop()


def verify_full(postgres: SystemPostgres, ca_file: str) -> str:
    return f"{postgres.dsn}?sslmode=verify-full&sslrootcert={ca_file}"


async def test_verify_full_accepts_the_database_the_ca_signed(
    tls_postgres: SystemPostgres, database_ca: trustme.CA, tmp_path: Path
) -> None:
    conn = await connect(verify_full(tls_postgres, write_ca(database_ca, tmp_path / "ca.pem")))
    try:
        assert await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await conn.close()


async def test_verify_full_refuses_a_database_signed_by_another_ca(
    tls_postgres: SystemPostgres, tmp_path: Path
) -> None:
    stranger = write_ca(trustme.CA(), tmp_path / "stranger.pem")
    with pytest.raises((ssl.SSLError, asyncpg.PostgresError, OSError)):
        await connect(verify_full(tls_postgres, stranger))


async def test_verify_full_refuses_a_certificate_for_another_name(
    tls_postgres: SystemPostgres, database_ca: trustme.CA, tmp_path: Path
) -> None:
    ca_file = write_ca(database_ca, tmp_path / "ca.pem")
    # The certificate names 127.0.0.1; "localhost" reaches the same server by another name.
    dsn = verify_full(tls_postgres, ca_file).replace("@127.0.0.1:", "@localhost:")
    with pytest.raises((ssl.SSLError, asyncpg.PostgresError, OSError)):
        await connect(dsn)


async def test_awp_server_serves_from_a_database_reached_with_verify_full(
    tls_postgres: SystemPostgres, database_ca: trustme.CA, tmp_path: Path
) -> None:
    dsn = verify_full(tls_postgres, write_ca(database_ca, tmp_path / "ca.pem"))
    conn = await connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    config = ServerConfig(
        database_url=dsn, listen="127.0.0.1:0", metrics_listen=None, insecure=True
    )
    running = await app.start(config)
    try:
        async with channel(f"127.0.0.1:{running.port}", ClientTls()) as chan:
            health = health_pb2_grpc.HealthStub(chan)

            async def serving() -> bool:
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                return answer.status == health_pb2.HealthCheckResponse.SERVING

            await poll_until(serving, within=20)
    finally:
        await running.stop(0)
