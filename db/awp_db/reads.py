"""Consistent multi-statement reads."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from awp_db.connect import Conn, Pool


@contextlib.asynccontextmanager
async def snapshot(pool: Pool) -> AsyncIterator[Conn]:
    """A connection whose reads all see one snapshot, so figures read apart still agree."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        yield conn
