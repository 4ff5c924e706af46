"""Every connection carries the bound on how long one transaction may hold its locks.

A client stopped in the middle of a command (between asyncpg's prepare and execute)
leaves its backend active and waiting for input, where neither the idle nor the
statement limit applies: transaction_timeout (PostgreSQL 17+) is what ends it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from awp_db.connect import SessionLimits, connect, create_pool

LIMITS = SessionLimits(1.0)


async def test_pooled_and_dedicated_connections_bound_a_transaction(database_dsn: str) -> None:
    pool = await create_pool(database_dsn, min_size=1, max_size=1, limits=LIMITS)
    try:
        assert await pool.fetchval("SHOW transaction_timeout") == "2s"
    finally:
        await pool.close()
    conn = await connect(database_dsn, limits=LIMITS)
    try:
        assert await conn.fetchval("SHOW transaction_timeout") == "2s"
    finally:
        await conn.close()
    unbounded = await connect(database_dsn, limits=None)  # migrations
    try:
        assert await unbounded.fetchval("SHOW transaction_timeout") == "0"
    finally:
        await unbounded.close()


async def test_a_transaction_holding_locks_too_long_is_ended(database_dsn: str) -> None:
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
