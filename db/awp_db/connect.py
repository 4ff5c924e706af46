"""Connections to PostgreSQL with the codecs and the bounded waits every AWP process expects."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    # What storage functions accept: a plain connection or one borrowed from a pool.
    Conn: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Conn = asyncpg.Connection

# Dead-peer detection on an idle connection, both ends (seconds): first probe after 5 s of
# silence, then every 2 s, given up after 3 unanswered: a half-open connection (a
# partition, a frozen VM) is closed within 11 s instead of the kernel's two hours. The
# same 11 s bounds data sent and never acknowledged (TCP_USER_TIMEOUT).
KEEPALIVE_IDLE_S: Final = 5
KEEPALIVE_INTERVAL_S: Final = 2
KEEPALIVE_COUNT: Final = 3
DEAD_PEER_S: Final = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT

# What PostgreSQL answers when one of the limits below ends a wait: the work was rolled
# back and may simply be tried again (DESIGN.md §6), so callers treat these as "the
# database is unavailable right now", never as a bug.
TIMEOUT_ERRORS: Final = (
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout
    asyncpg.exceptions.QueryCanceledError,  # statement_timeout (or a cancel)
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
)
# transaction_timeout exists from PostgreSQL 17; an older server refuses the unknown
# setting at connection time, so it is set after connecting, where the server has it.
TRANSACTION_TIMEOUT_SINCE: Final = 17


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How long one session may make others wait, or wait itself (DESIGN.md §6).

    Everything follows from one number, the stall bound: how long a process may stop
    inside a transaction (SIGSTOP, a GC pause, a partition) before PostgreSQL drops its
    session and the row locks it held. docs/liveness.md explains the numbers.
    """

    stall_s: float

    @classmethod
    def for_lease_ttl(cls, lease_ttl_s: float) -> SessionLimits:
        """A fifth of the lease TTL, within 1-5 s: a stalled holder's locks go long
        before a lease could expire unnoticed behind them, and a normal transaction
        (milliseconds) never comes near it."""
        return cls(min(max(lease_ttl_s / 5, 1.0), 5.0))

    @property
    def lock_s(self) -> float:
        # Longer than a stalled holder can keep a lock: a waiter behind one gets the lock
        # when PostgreSQL drops that holder, instead of failing first. Shorter than
        # held_s, so that a wait that does fail ends in its own clear error.
        return 1.5 * self.stall_s

    @property
    def statement_s(self) -> float:
        # A statement may wait for a lock and then do its own work.
        return 3 * self.stall_s

    @property
    def transaction_s(self) -> float:
        """The deadline of one batched transaction, end to end; after it the client gives
        the connection up, whatever the server is doing (e.g. it is unreachable)."""
        return self.statement_s

    @property
    def held_s(self) -> float:
        """The longest one transaction may hold its locks, whatever it is doing. A client
        stopped in the middle of a command (asyncpg prepares a statement before it
        executes it, without a Sync between) leaves its backend active and waiting for
        input: neither the idle nor the statement limit applies, this one does. A
        transaction that waited for a stalled holder to be dropped (stall_s) still has
        a stall's time to finish."""
        return 2 * self.stall_s

    @property
    def straggler_s(self) -> float:
        """How long a batched transaction may run before the next batch stops waiting
        for it and starts on another connection."""
        return self.stall_s / 4

    def server_settings(self) -> dict[str, str]:
        """Session settings, sent in the startup packet (no extra round trip)."""
        return {
            "idle_in_transaction_session_timeout": _ms(self.stall_s),
            "lock_timeout": _ms(self.lock_s),
            "statement_timeout": _ms(self.statement_s),
            # The backend's side of the connection (ignored over a Unix socket).
            "tcp_keepalives_idle": str(KEEPALIVE_IDLE_S),
            "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_S),
            "tcp_keepalives_count": str(KEEPALIVE_COUNT),
            "tcp_user_timeout": _ms(DEAD_PEER_S),
        }


# The limits of a process that does not know the lease TTL (the coordinator, the
# listener and leader connections): those of the servers' default TTL, 15 s.
DEFAULT_LIMITS: Final = SessionLimits(3.0)


def _ms(seconds: float) -> str:
    return str(round(seconds * 1000))


def keep_alive(conn: asyncpg.Connection) -> None:
    """TCP keepalives on our side of the connection (asyncpg has no option for them)."""
    transport = getattr(conn, "_transport", None)
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket: no network to lose
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", DEAD_PEER_S * 1000),
    ):
        if hasattr(socket, option):  # Linux has all four; other systems some
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


async def _bound_transactions(conn: asyncpg.Connection, limits: SessionLimits | None) -> None:
    if limits is not None and conn.get_server_version().major >= TRANSACTION_TIMEOUT_SINCE:
        await conn.execute(f"SET transaction_timeout = {_ms(limits.held_s)}")


async def init_connection(conn: asyncpg.Connection) -> None:
    keep_alive(conn)
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


def _settings(application_name: str, limits: SessionLimits | None) -> dict[str, str]:
    extra = {} if limits is None else limits.server_settings()
    return {"application_name": application_name, **extra}


async def create_pool(
    dsn: str,
    min_size: int = 2,
    max_size: int = 10,
    *,
    application_name: str = "awp",
    limits: SessionLimits = DEFAULT_LIMITS,
    **kwargs: Any,
) -> Pool:
    async def init(conn: asyncpg.Connection) -> None:
        await init_connection(conn)
        await _bound_transactions(conn, limits)

    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init,
        reset=_keep_session,
        server_settings=_settings(application_name, limits),
        **kwargs,
    )
    if pool is None:  # pragma: no cover - asyncpg returns None only without awaiting
        raise RuntimeError("asyncpg did not create a pool")
    return pool


async def connect(
    dsn: str, application_name: str = "awp", limits: SessionLimits | None = DEFAULT_LIMITS
) -> asyncpg.Connection:
    """A dedicated connection. limits=None only for work that may legitimately wait
    long (migrations queue on an advisory lock and may rewrite big tables)."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, server_settings=_settings(application_name, limits)
    )
    await init_connection(conn)
    await _bound_transactions(conn, limits)
    return conn
