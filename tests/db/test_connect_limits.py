"""Every connection carries the bound on how long one transaction may hold its locks.

A client stopped in the middle of a command (between asyncpg's prepare and execute)
leaves its backend active and waiting for input, where neither the idle nor the
statement limit applies: transaction_timeout (PostgreSQL 17+) is what ends it. Older
servers do not have it (docs/postgres.md, Supported versions): there AWP sets the other
limits alone, and a busy transaction runs for as long as it must."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from awp_db.connect import TRANSACTION_TIMEOUT_SINCE, SessionLimits, connect, create_pool

LIMITS = SessionLimits(1.0)


async def _major(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return conn.get_server_version().major
    finally:
        await conn.close()


async def test_pooled_and_dedicated_connections_bound_a_transaction(database_dsn: str) -> None:
    has_it = await _major(database_dsn) >= TRANSACTION_TIMEOUT_SINCE
    # current_setting(..., true): NULL where the server has no such setting.
    query = "SELECT current_setting('transaction_timeout', true)"
    pool = await create_pool(database_dsn, min_size=1, max_size=1, limits=LIMITS)
    try:
        assert await pool.fetchval(query) == ("2s" if has_it else None)
        assert await pool.fetchval("SHOW idle_in_transaction_session_timeout") == "1s"
    finally:
        await pool.close()
    conn = await connect(database_dsn, limits=LIMITS)
    try:
        assert await conn.fetchval(query) == ("2s" if has_it else None)
        assert await conn.fetchval("SHOW lock_timeout") == "1500ms"
    finally:
        await conn.close()
    unbounded = await connect(database_dsn, limits=None)  # migrations
    try:
        assert await unbounded.fetchval(query) == ("0" if has_it else None)
        assert await unbounded.fetchval("SHOW lock_timeout") == "0"
    finally:
        await unbounded.close()


async def test_a_transaction_holding_locks_too_long_is_ended(database_dsn: str) -> None:
    if await _major(database_dsn) < TRANSACTION_TIMEOUT_SINCE:
        pytest.skip("transaction_timeout is PostgreSQL 17+ (docs/postgres.md)")
    conn = await connect(database_dsn, limits=LIMITS)
    try:
        # PostgreSQL ends the whole session (and so every lock it held).
        with pytest.raises((asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError)):
            async with conn.transaction():
                await conn.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
                # Busy, not idle, for longer than the bound: only transaction_timeout ends it.
                for _ in range(5):
                    await conn.execute("SELECT pg_sleep(0.9)")
                    await asyncio.sleep(0)
        assert conn.is_closed()
    finally:
        await conn.close()
