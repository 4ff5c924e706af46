"""AWP's connections behind a real pgbouncer (Debian's 1.18) in transaction mode
(docs/postgres.md): no prepared statement kept across transactions, no session setting
relied on, LISTEN over the session URL. The whole cluster behind it, with a coordinator
killed: tests/fault/test_faults_pooler.py.

pgbouncer runs here with ONE backend per pool, so every client shares it with every other:
what one client leaves in its session, the next one meets.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from awp_coordinator import config as coordinator_config
from awp_db import leadership, pooler
from awp_db.connect import PoolMode, SessionLimits, connect, create_pool
from awp_db.listen import Listener
from awp_server import config as server_config
from kit.pgbouncer import PgBouncer, running

LIMITS = SessionLimits(2.0)
CLIENTS = 6
BIN_DIR = Path(sys.executable).parent


@pytest.fixture
async def bouncer(database_dsn: str) -> AsyncIterator[PgBouncer]:
    bouncer = PgBouncer(database_dsn, pool_size=1).start()
    try:
        await bouncer.wait_ready()
        yield bouncer
    finally:
        bouncer.stop()


async def _work(pool: asyncpg.Pool, client: int) -> None:
    """What AWP's passes and RPCs do: parameterised statements, alone and in transactions."""
    for i in range(20):
        assert await pool.fetchval("SELECT $1::int + $2::int", client, i) == client + i
        await leadership.current(pool)
        async with pool.acquire() as conn, conn.transaction():
            assert await conn.fetchval("SELECT $1::text", f"{client}-{i}") == f"{client}-{i}"
            await conn.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1::uuid[])", [])


async def test_a_session_mode_pool_breaks_behind_a_transaction_pooler(database_dsn: str) -> None:
    """The failure the pool mode exists for (issue 16): a statement prepared by name on one
    backend, used again on another. pgbouncer reuses its most recently used backend first
    (server_round_robin = 0), so a transaction opened right after takes the backend the
    statement was prepared on, and the statement's next use lands on the other one."""
    with running(database_dsn, pool_size=2) as bouncer:
        await bouncer.wait_ready()
        pool = await create_pool(bouncer.pooled_dsn, min_size=1, max_size=1, limits=LIMITS)
        other = await asyncpg.connect(bouncer.pooled_dsn, statement_cache_size=0)
        try:
            assert await pool.fetchval("SELECT $1::int", 1) == 1
            async with other.transaction():
                await other.execute("SELECT 1")
                with pytest.raises(asyncpg.exceptions.InvalidSQLStatementNameError):
                    await pool.fetchval("SELECT $1::int", 2)
        finally:
            await other.close()
            await pool.close()


async def test_transaction_mode_keeps_nothing_across_transactions(bouncer: PgBouncer) -> None:
    pools = [
        await create_pool(
            bouncer.pooled_dsn, min_size=1, max_size=2, limits=LIMITS, mode=PoolMode.TRANSACTION
        )
        for _ in range(CLIENTS)
    ]
    try:
        await asyncio.gather(*(_work(pool, client) for client, pool in enumerate(pools)))
        # Nothing was prepared by name on the one backend every client used.
        assert await pools[0].fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
    finally:
        for pool in pools:
            await pool.close()


async def test_the_limits_are_checked_where_they_cannot_be_set(
    bouncer: PgBouncer, database_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Transaction mode sets nothing per connection: the role must carry the limits, and
    a process says once at start which ones it does not, with the statement that fixes each."""
    pool = await create_pool(bouncer.pooled_dsn, limits=LIMITS, mode=PoolMode.TRANSACTION)
    try:
        with caplog.at_level(logging.WARNING, logger="awp.db.pooler"):
            looser = await pooler.check_limits(pool, LIMITS)
        async with pool.acquire() as conn:
            wanted = LIMITS.waits(conn.get_server_version().major)
        assert sorted(limit.name for limit in looser) == sorted(wanted)
        (warning,) = caplog.records
        assert "session limits not in force" in warning.message
        assert "ALTER ROLE postgres IN DATABASE" in warning.fix
    finally:
        await pool.close()

    admin = await connect(database_dsn)
    try:
        for limit in looser:
            await admin.execute(limit.fix)
    finally:
        await admin.close()
    # Role settings apply to backends opened afterwards: a new pooler's.
    fresh = PgBouncer(database_dsn, pool_size=1).start()
    try:
        await fresh.wait_ready()
        pool = await create_pool(fresh.pooled_dsn, limits=LIMITS, mode=PoolMode.TRANSACTION)
        try:
            assert await pooler.check_limits(pool, LIMITS) == []
            assert await pool.fetchval("SHOW lock_timeout") == "3s"
        finally:
            await pool.close()
    finally:
        fresh.stop()


async def test_listen_over_the_session_url_hears_what_the_pooled_url_notifies(
    bouncer: PgBouncer,
) -> None:
    # A dedicated connection through a pooler gets its limits after connecting: in the
    # startup packet, pgbouncer would refuse them ("unsupported startup parameter").
    conn = await connect(bouncer.session_dsn, limits=LIMITS)
    try:
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "2s"
    finally:
        await conn.close()

    listener = Listener(bouncer.session_dsn, ["awp_test_pooler"])
    await listener.start()
    pool = await create_pool(bouncer.pooled_dsn, limits=LIMITS, mode=PoolMode.TRANSACTION)
    try:
        assert await listener.wait_connected(10)
        async with listener.subscribe("awp_test_pooler", key="run-1") as waiter:
            async with pool.acquire() as sender, sender.transaction():
                await sender.execute("SELECT pg_notify('awp_test_pooler', 'run-1')")
            assert await waiter.wait(10), "the notification never arrived"
    finally:
        await pool.close()
        await listener.stop()


@pytest.mark.parametrize(
    "parse",
    [
        lambda argv: server_config.parse([*argv, "--insecure"], {}),
        lambda argv: coordinator_config.parse(argv, {}),
    ],
    ids=["awp-server", "awp-coordinator"],
)
def test_transaction_mode_needs_a_session_url(
    parse: object, capsys: pytest.CaptureFixture[str]
) -> None:
    pooled = [
        "--database-url",
        "postgresql://awp@pooler/awp",
        "--database-pool-mode",
        "transaction",
    ]
    with pytest.raises(SystemExit) as exited:
        parse(pooled)  # type: ignore[operator]
    assert exited.value.code == 2
    assert "needs --session-database-url" in capsys.readouterr().err
    config = parse([*pooled, "--session-database-url", "postgresql://awp@db/awp"])  # type: ignore[operator]
    assert config.session_url == "postgresql://awp@db/awp"
    assert config.database_pool_mode is PoolMode.TRANSACTION


async def test_the_probe_tells_a_transaction_pooler_from_a_session(
    bouncer: PgBouncer, database_dsn: str
) -> None:
    assert await pooler.transaction_pooled(bouncer.pooled_dsn)
    assert not await pooler.transaction_pooled(bouncer.session_dsn)
    assert not await pooler.transaction_pooled(database_dsn)
    # Several backends in the transaction pool: pgbouncer still moves the connections.
    with running(database_dsn, pool_size=4) as wide:
        await wide.wait_ready()
        assert await pooler.transaction_pooled(wide.pooled_dsn)
        assert not await pooler.transaction_pooled(wide.session_dsn)


async def test_a_url_that_is_not_the_pool_it_is_said_to_be_is_refused(
    bouncer: PgBouncer, database_dsn: str
) -> None:
    with pytest.raises(pooler.PoolerMismatch, match="give --database-pool-mode transaction"):
        await pooler.check_modes(bouncer.pooled_dsn, bouncer.pooled_dsn, PoolMode.SESSION)
    # The same pooler under another name, as the session URL.
    elsewhere = bouncer.pooled_dsn.replace("127.0.0.1", "localhost")
    with pytest.raises(pooler.PoolerMismatch, match=r"^--session-database-url leads to a pooler"):
        await pooler.check_modes(bouncer.pooled_dsn, elsewhere, PoolMode.TRANSACTION)
    await pooler.check_modes(bouncer.pooled_dsn, bouncer.session_dsn, PoolMode.TRANSACTION)
    await pooler.check_modes(bouncer.session_dsn, bouncer.session_dsn, PoolMode.SESSION)
    await pooler.check_modes(database_dsn, database_dsn, PoolMode.SESSION)


@pytest.mark.parametrize(
    "argv",
    [
        ["awp-server", "--insecure", "--listen", "127.0.0.1:0"],
        ["awp-coordinator"],
    ],
    ids=["awp-server", "awp-coordinator"],
)
def test_a_binary_pointed_at_a_transaction_pooler_in_session_mode_refuses_to_start(
    bouncer: PgBouncer, argv: list[str]
) -> None:
    """One line naming the setting, exit 2: not a prepared statement error at the first
    call, nor session limits silently not in force."""
    ended = subprocess.run(
        [str(BIN_DIR / argv[0]), *argv[1:], "--metrics-listen", "off"],
        env={"AWP_DATABASE_URL": bouncer.pooled_dsn, "AWP_LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ended.returncode == 2, ended.stderr
    (line,) = [line for line in ended.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith(f"{argv[0]}: --database-url leads to a pooler in transaction mode")
    assert "give --database-pool-mode transaction" in line
