"""The migration runner: applies each migration once, also under concurrent starts."""

from __future__ import annotations

import asyncio

import asyncpg

from awp_db.connect import connect
from awp_db.migrate import applied, available, migrate


async def test_fresh_database_is_fully_migrated(conn: asyncpg.Connection) -> None:
    assert await applied(conn) == [m.version for m in available()]
    assert await migrate(conn) == []


async def test_concurrent_migrators_apply_each_migration_once(
    postgres: object, database_dsn: str
) -> None:
    setup = await connect(database_dsn)
    await setup.execute(
        "DROP SCHEMA public CASCADE; CREATE SCHEMA public; DROP SEQUENCE IF EXISTS fencing_tokens"
    )
    await setup.close()
    conns = [await connect(database_dsn) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        applied_by_someone = sorted(v for r in results for v in r)
        assert applied_by_someone == [m.version for m in available()]
        rows = await conns[0].fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == [m.version for m in available()]
    finally:
        for c in conns:
            await c.close()
