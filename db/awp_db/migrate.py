"""The database schema: the numbered migrations in `migrations/`, applied once each, in
order, and the check a process makes before it serves (docs/postgres.md, Migrations).

Safe when several processes migrate together: a session advisory lock serialises them,
and each migration commits with its row in `schema_migrations`. That lock needs a
session: behind a pooler in transaction mode, migrate over --session-database-url.

A schema newer than this build knows (migrated by a newer AWP) is served with a
warning, not refused: during a rolling upgrade, and after a rollback, older processes
run on the newer schema anyway, so migrations only add (a column, a table, an index)
and never take away what an older release still uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final, TypeVar

import asyncpg
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from awp_db.connect import DEFAULT_LIMITS, Conn, SessionLimits, connect
from awp_db.signals import MIGRATION_LOCK_KEY

log = logging.getLogger("awp.db.migrate")

T = TypeVar("T")

# The step an operator runs when a process will not migrate itself (--no-migrate).
MIGRATE_COMMAND: Final = "awp-server migrate"

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


@dataclass(frozen=True, slots=True)
class SchemaState:
    """The migrations a database has, against those this build knows."""

    applied: tuple[int, ...]
    known: tuple[int, ...]

    @property
    def version(self) -> int:
        return max(self.applied, default=0)

    @property
    def needed(self) -> int:
        return max(self.known, default=0)

    @property
    def pending(self) -> list[int]:
        return sorted(set(self.known) - set(self.applied))

    @property
    def newer(self) -> list[int]:
        """Applied by a newer AWP; unknown to this build."""
        return sorted(set(self.applied) - set(self.known))


class SchemaError(Exception):
    """The database's schema cannot be served by this build as it is."""


async def schema_state(conn: Conn) -> SchemaState:
    return SchemaState(tuple(await applied(conn)), tuple(m.version for m in available()))


def _refuse_diverged(state: SchemaState) -> None:
    if state.pending and state.newer:
        raise SchemaError(
            f"the database has migrations {state.newer} this build does not know and lacks "
            f"{state.pending} it needs: it was migrated by another line of AWP; migrate "
            "it with that one"
        )


def _warn_newer(state: SchemaState) -> None:
    log.warning(
        "the database schema is newer than this build: serving (migrations only add); "
        "upgrade this process",
        extra={"schema_version": state.version, "build_version": state.needed},
    )


def check(state: SchemaState) -> None:
    """What a process that does not migrate (--no-migrate) checks before it serves:
    SchemaError when the schema lacks a migration this build needs."""
    _refuse_diverged(state)
    if state.pending:
        raise SchemaError(
            f"the database schema is at version {state.version}, this build needs "
            f"{state.needed} ({len(state.pending)} migration(s) pending): run "
            f"`{MIGRATE_COMMAND}` first (or start without --no-migrate)"
        )
    if state.newer:
        _warn_newer(state)


async def migrate(
    conn: Conn, on_applied: Callable[[Migration, float], None] | None = None
) -> list[int]:
    """Applies what is missing; returns the versions applied by this call. on_applied:
    told of each migration once it committed, with the seconds it took."""
    done: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        state = await schema_state(conn)
        _refuse_diverged(state)
        if state.newer:
            _warn_newer(state)
        for migration in available():
            if migration.version in state.applied:
                continue
            started = time.monotonic()
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            log.info("applied migration", extra={"version": migration.version})
            if on_applied is not None:
                on_applied(migration, time.monotonic() - started)
            done.append(migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return done


async def when_reachable(
    dsn: str,
    work: Callable[[Conn], Awaitable[T]],
    *,
    limits: SessionLimits | None = DEFAULT_LIMITS,
    give_up_after_s: float = 120.0,
) -> T:
    """work on a dedicated connection, once PostgreSQL answers: processes may start
    before their database."""
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
            conn = await connect(dsn, application_name="awp-migrate", limits=limits)
            try:
                return await work(conn)
            finally:
                await conn.close()
    raise AssertionError("unreachable: tenacity re-raises")


async def migrate_when_reachable(dsn: str, give_up_after_s: float = 120.0) -> list[int]:
    """Migrates once PostgreSQL answers. Without limits: a migration queues on the
    advisory lock and may rewrite big tables."""
    return await when_reachable(dsn, migrate, limits=None, give_up_after_s=give_up_after_s)


async def check_when_reachable(dsn: str, give_up_after_s: float = 120.0) -> SchemaState:
    """The schema's state once PostgreSQL answers, checked (`check`)."""
    state = await when_reachable(dsn, schema_state, give_up_after_s=give_up_after_s)
    check(state)
    return state


async def prepare(dsn: str, *, migrating: bool, stop: asyncio.Event) -> bool:
    """What a process does with the schema before it serves, while PostgreSQL may still be
    starting: migrates it, or (--no-migrate) checks it. False when stop came first (a
    SIGTERM during the start ends the wait at once); SchemaError when it cannot serve."""
    work = asyncio.create_task(
        migrate_when_reachable(dsn) if migrating else check_when_reachable(dsn)
    )
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return False
    work.result()
    return True
