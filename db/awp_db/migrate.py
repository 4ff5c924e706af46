"""Applies the numbered migrations in `migrations/` once each, in order.

Safe when several processes start together: a session advisory lock serialises them,
and each migration commits with its row in `schema_migrations`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Final

import asyncpg
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from awp_db.connect import Conn, connect
from awp_db.signals import MIGRATION_LOCK_KEY

log = logging.getLogger("awp.db.migrate")

_FILE: Final = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    found = []
    for entry in resources.files("awp_db").joinpath("migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


async def applied(conn: Conn) -> list[int]:
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return []
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    return [row["version"] for row in rows]


async def migrate(conn: Conn) -> list[int]:
    """Applies what is missing; returns the versions applied by this call."""
    done: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        already = set(await applied(conn))
        known = available()
        unknown = already - {m.version for m in known}
        if unknown:
            raise RuntimeError(
                f"database has migrations {sorted(unknown)} this build does not know: "
                "it was migrated by a newer AWP"
            )
        for migration in known:
            if migration.version in already:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            log.info("applied migration", extra={"version": migration.version})
            done.append(migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return done


async def migrate_when_reachable(dsn: str, give_up_after_s: float = 120.0) -> list[int]:
    """Migrates once PostgreSQL answers; processes may start before their database."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(
            (OSError, asyncpg.CannotConnectNowError, asyncpg.PostgresConnectionError)
        ),
        wait=wait_exponential_jitter(initial=0.2, max=5.0),
        stop=stop_after_delay(give_up_after_s),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    ):
        with attempt:
            conn = await connect(dsn, application_name="awp-migrate", limits=None)
            try:
                return await migrate(conn)
            finally:
                await conn.close()
    raise AssertionError("unreachable: tenacity re-raises")
