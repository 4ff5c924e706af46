"""schema.sql is exactly what the migrations produce from an empty database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import asyncpg
import pytest

from awp_db.connect import connect
from awp_db.migrate import migrate
from awp_db.schema import SCHEMA_SQL
from kit.postgres import PostgresHandle

# Every object of the schema, named independently of how it was made (so a column a
# migration appended compares equal to the same column in a CREATE TABLE), with its
# full definition. Comments are part of it: the file documents what the database holds.
CATALOG = """
WITH rel AS (
    SELECT c.oid, c.relname, c.relkind
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'public'
)
SELECT 'relation', relname, relkind::text FROM rel
UNION ALL
SELECT 'column', rel.relname || '.' || a.attname,
       concat_ws(' ', row_number() OVER (PARTITION BY rel.oid ORDER BY a.attnum),
                 format_type(a.atttypid, a.atttypmod), a.attnotnull,
                 pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated)
  FROM rel JOIN pg_attribute a ON a.attrelid = rel.oid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attnum > 0 AND NOT a.attisdropped AND rel.relkind IN ('r', 'p', 'v')
UNION ALL
SELECT 'constraint', rel.relname || '.' || con.conname, pg_get_constraintdef(con.oid)
  FROM rel JOIN pg_constraint con ON con.conrelid = rel.oid
UNION ALL
SELECT 'index', rel.relname, pg_get_indexdef(rel.oid) FROM rel WHERE rel.relkind = 'i'
UNION ALL
SELECT 'sequence', s.sequencename,
       concat_ws(' ', s.data_type, s.start_value, s.increment_by, s.min_value, s.max_value,
                 s.cache_size, s.cycle,
                 (SELECT dep.refobjid::regclass::text || '.' || dep.refobjsubid
                    FROM pg_depend dep
                   WHERE dep.objid = ('public.' || quote_ident(s.sequencename))::regclass
                     AND dep.deptype IN ('a', 'i') AND dep.refobjsubid > 0))
  FROM pg_sequences s WHERE s.schemaname = 'public'
UNION ALL
SELECT 'trigger', rel.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
  FROM rel JOIN pg_trigger t ON t.tgrelid = rel.oid WHERE NOT t.tgisinternal
UNION ALL
SELECT 'function', p.proname, pg_get_functiondef(p.oid)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
UNION ALL
SELECT 'comment', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
  FROM pg_description d
 WHERE d.classoid = 'pg_class'::regclass AND d.objoid IN (SELECT oid FROM rel)
ORDER BY 1, 2, 3
"""


@pytest.fixture
def empty_database(
    postgres: PostgresHandle,
) -> Callable[[], AbstractAsyncContextManager[asyncpg.Connection]]:
    @asynccontextmanager
    async def create() -> AsyncIterator[asyncpg.Connection]:
        name = f"awp_schema_{uuid.uuid4().hex[:16]}"
        admin = await connect(postgres.admin_dsn)
        try:
            await admin.execute(f"CREATE DATABASE {name}")
            conn = await connect(postgres.dsn(name))
            try:
                yield conn
            finally:
                await conn.close()
                await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        finally:
            await admin.close()

    return create


async def _catalog(conn: asyncpg.Connection) -> list[tuple[str, str, str]]:
    return [tuple(row) for row in await conn.fetch(CATALOG)]


async def test_migrating_an_empty_database_produces_schema_sql(
    empty_database: Callable[[], AbstractAsyncContextManager[asyncpg.Connection]],
) -> None:
    async with empty_database() as migrated, empty_database() as documented:
        await migrate(migrated)
        await documented.execute(SCHEMA_SQL.read_text("utf-8"))
        expected = await _catalog(migrated)
        got = await _catalog(documented)
    # Not vacuous: the catalog holds the tables, the lock-bearing rows and the comments.
    kinds = {kind for kind, _, _ in expected}
    assert {"relation", "column", "constraint", "index", "sequence", "comment"} <= kinds
    assert ("relation", "dispatches", "r") in expected
    # On failure: a migration changed the schema; run `make schema` and commit schema.sql.
    assert got == expected
