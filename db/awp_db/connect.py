"""Connections to PostgreSQL with the codecs every AWP process expects."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    # What storage functions accept: a plain connection or one borrowed from a pool.
    Conn: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Conn = asyncpg.Connection


async def init_connection(conn: asyncpg.Connection) -> None:
    # jsonb travels as Python objects; json.dumps/loads are the C-accelerated codecs.
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing beyond what asyncpg always does (roll back an open transaction).

    asyncpg's default reset runs `pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL` on every release: one more round trip and one more transaction per
    borrowed connection, i.e. per RPC. AWP never keeps session state on a pooled
    connection (session advisory locks and LISTEN live on dedicated connections,
    settings are per transaction), so there is nothing to reset. Keep it that way.
    """


async def create_pool(dsn: str, min_size: int = 2, max_size: int = 10, **kwargs: Any) -> Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        reset=_keep_session,
        server_settings={"application_name": kwargs.pop("application_name", "awp")},
        **kwargs,
    )
    if pool is None:  # pragma: no cover - asyncpg returns None only without awaiting
        raise RuntimeError("asyncpg did not create a pool")
    return pool


async def connect(dsn: str, application_name: str = "awp") -> asyncpg.Connection:
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, server_settings={"application_name": application_name}
    )
    await init_connection(conn)
    return conn
