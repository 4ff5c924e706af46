"""Migrations as a step of their own (docs/postgres.md, Migrations), with the real
binaries: `awp-server migrate` applies what is pending and exits; `--no-migrate` makes a
server or coordinator refuse a schema older than it needs, naming the command to run; a
newer schema (a rolling upgrade, a rollback) is served with a warning."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from awp_db.connect import connect
from awp_db.migrate import MIGRATE_COMMAND, available
from kit.postgres import PostgresHandle

BIN_DIR = Path(sys.executable).parent
LATEST = available()[-1]
# A process that does not start must say so well within this; one that serves, print so.
WITHIN_S = 60.0


@dataclass
class Finished:
    code: int
    out: str
    err: str


def _env() -> dict[str, str]:
    # The developer's AWP_* variables must not reach the processes.
    return {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}


async def _run(binary: str, *argv: str) -> Finished:
    process = await asyncio.create_subprocess_exec(
        str(BIN_DIR / binary),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    out, err = await asyncio.wait_for(process.communicate(), WITHIN_S)
    assert process.returncode is not None
    return Finished(process.returncode, out.decode(), err.decode())


def _server_argv(dsn: str, *extra: str) -> list[str]:
    return [
        "--database-url",
        dsn,
        "--insecure",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "off",
        "--log-format",
        "json",
        *extra,
    ]


async def _serves_then_stops(argv: Sequence[str]) -> str:
    """Starts awp-server, waits for its listening line, stops it (SIGTERM): its log."""
    process = await asyncio.create_subprocess_exec(
        str(BIN_DIR / "awp-server"),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=_env(),
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(WITHIN_S):
            while not any("awp-server listening on" in line for line in lines):
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise AssertionError("awp-server exited:\n" + "".join(lines))
                lines.append(line)
    finally:
        if process.returncode is None:
            process.terminate()
        rest, _ = await asyncio.wait_for(process.communicate(), WITHIN_S)
    assert process.returncode == 0, "".join(lines) + rest.decode()
    return "".join(lines) + rest.decode()


@pytest.fixture
async def blank_dsn(postgres: PostgresHandle) -> AsyncIterator[str]:
    """A database no AWP has touched."""
    name = f"awp_test_blank_{uuid.uuid4().hex[:12]}"
    admin = await connect(postgres.admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    yield postgres.dsn(name)
    admin = await connect(postgres.admin_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


async def _versions(dsn: str) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            return []
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
        return [row["version"] for row in rows]
    finally:
        await conn.close()


async def test_migrate_applies_what_is_pending_and_exits(blank_dsn: str) -> None:
    # Migrations connect over the session URL: the other one is never reached.
    unreachable = "postgresql://awp@127.0.0.1:1/awp"
    first = await _run(
        "awp-server", "migrate", "--database-url", unreachable, "--session-database-url", blank_dsn
    )
    assert first.code == 0, first.err
    every = [m.version for m in available()]
    assert f"schema at version 0, this build's is {LATEST.version}" in first.out
    assert f"applying {len(every)} migration(s)" in first.out
    for migration in available():
        assert f"applied {migration.version:04d}_{migration.name} (" in first.out
    assert f"schema at version {LATEST.version}: up to date ({len(every)} applied)" in first.out
    assert await _versions(blank_dsn) == every

    again = await _run("awp-server", "migrate", "--database-url", blank_dsn)
    assert again.code == 0, again.err
    assert again.out.strip() == (
        f"awp-server migrate: schema at version {LATEST.version}: up to date (0 applied)"
    )


async def test_no_migrate_refuses_an_older_schema_and_names_the_step(blank_dsn: str) -> None:
    server = await _run("awp-server", *_server_argv(blank_dsn, "--no-migrate"))
    coordinator = await _run(
        "awp-coordinator", "--database-url", blank_dsn, "--no-migrate", "--metrics-listen", "off"
    )
    for name, finished in (("awp-server", server), ("awp-coordinator", coordinator)):
        assert finished.code == 2, (name, finished.err)
        assert f"run `{MIGRATE_COMMAND}` first" in finished.err, (name, finished.err)
        assert f"schema is at version 0, this build needs {LATEST.version}" in finished.err
    assert await _versions(blank_dsn) == [], "--no-migrate migrated"

    assert (await _run("awp-server", "migrate", "--database-url", blank_dsn)).code == 0
    await _serves_then_stops(_server_argv(blank_dsn, "--no-migrate"))


async def test_a_newer_schema_is_served_with_a_warning(database_dsn: str) -> None:
    conn = await asyncpg.connect(database_dsn)
    try:
        await conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_a_newer_awp')",
            LATEST.version + 1,
        )
    finally:
        await conn.close()
    for extra in (["--no-migrate"], []):
        log = await _serves_then_stops(_server_argv(database_dsn, *extra))
        assert "the database schema is newer than this build" in log, extra
    step = await _run("awp-server", "migrate", "--database-url", database_dsn)
    assert step.code == 0, step.err
    assert f"newer than this build's {LATEST.version}" in step.out


async def test_a_schema_from_another_line_is_refused(database_dsn: str) -> None:
    """It lacks a migration this build has and has one it does not know: applying the
    missing one now could undo what the unknown one did."""
    conn = await asyncpg.connect(database_dsn)
    try:
        await conn.execute("DELETE FROM schema_migrations WHERE version = $1", LATEST.version)
        await conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, 'elsewhere')",
            LATEST.version + 1,
        )
    finally:
        await conn.close()
    step = await _run("awp-server", "migrate", "--database-url", database_dsn)
    server = await _run("awp-server", *_server_argv(database_dsn, "--no-migrate"))
    for finished in (step, server):
        assert finished.code == 2, finished.err
        assert "another line of AWP" in finished.err
