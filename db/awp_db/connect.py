"""Connections to PostgreSQL with the codecs and the bounded waits every AWP process expects."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from enum import StrEnum
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

# How long a pooled connection keeps a prepared statement before preparing it again.
# PostgreSQL keeps the generic plan it settles on after a statement's first five runs
# until the statement is prepared again or a table it reads is analyzed, and a plan made
# while a table was nearly empty stays wrong as it grows: on a new database the
# settlement's lock of its dispatches kept a sequential scan of every dispatch ever made,
# and the lease a bitmap scan over every dead entry of the live dispatches' index, until
# autovacuum analyzed the table (its naptime alone is a minute) or asyncpg's default
# 300 s ran out. Preparing again costs a parse and five planned runs per statement.
STATEMENT_LIFETIME_S: Final = 3

# What PostgreSQL answers when one of the limits below ends a wait: the work was rolled
# back and may simply be tried again (DESIGN.md §6), so callers treat these as "the
# database is unavailable right now", never as a bug.
TIMEOUT_ERRORS: Final = (
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout
    asyncpg.exceptions.QueryCanceledError,  # statement_timeout (or a cancel)
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
)


def ended_by_server(exc: BaseException) -> bool:
    """Whether ``exc`` is asyncpg's report of a command issued on a session PostgreSQL had
    already ended: the FATAL error that ends it (the idle-in-transaction timeout above, an
    administrator's terminate) arrived while this process could not read -- stopped, or
    its loop busy -- and asyncpg, still consuming that error (its protocol state 2) when
    the next command came, refuses the command with an InternalClientError instead of
    naming the lost connection. Like TIMEOUT_ERRORS, the work was rolled back."""
    return isinstance(exc, asyncpg.InternalClientError) and "another operation (2)" in str(exc)


# transaction_timeout exists from PostgreSQL 17; older servers refuse the unknown
# setting, so it is set only where the server has it (docs/postgres.md: on 15 and 16 a
# client stopped in the middle of a command keeps its locks until it resumes or TCP
# gives up).
TRANSACTION_TIMEOUT_SINCE: Final = 17


class PoolMode(StrEnum):
    """What --database-url leads to (docs/postgres.md)."""

    # A connection is one PostgreSQL session for its whole life: PostgreSQL itself, or a
    # pooler in session mode.
    SESSION = "session"
    # A pooler in transaction mode (pgbouncer pool_mode=transaction): every transaction,
    # and every statement outside one, may run on another backend. Nothing may rely on
    # session state there: no session settings, no prepared statement kept for later.
    TRANSACTION = "transaction"


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

    def waits(self, server_major: int) -> dict[str, str]:
        """The settings that bound how long a session makes others wait, or waits itself
        (milliseconds), on a server of this major version."""
        waits = {
            "idle_in_transaction_session_timeout": _ms(self.stall_s),
            "lock_timeout": _ms(self.lock_s),
            "statement_timeout": _ms(self.statement_s),
        }
        if server_major >= TRANSACTION_TIMEOUT_SINCE:
            waits["transaction_timeout"] = _ms(self.held_s)
        return waits

    def settings(self, server_major: int) -> dict[str, str]:
        """Every session setting: the waits, and the backend's side of the keepalives
        (ignored over a Unix socket)."""
        return {
            **self.waits(server_major),
            "tcp_keepalives_idle": str(KEEPALIVE_IDLE_S),
            "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_S),
            "tcp_keepalives_count": str(KEEPALIVE_COUNT),
            "tcp_user_timeout": _ms(DEAD_PEER_S),
        }


# The limits of a process that does not know the lease TTL (the coordinator, the
# listener connections): those of the servers' default TTL, 15 s.
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


async def set_limits(conn: asyncpg.Connection, limits: SessionLimits | None) -> None:
    """Sets the session's limits in one round trip (simple query protocol, nothing
    prepared). After connecting rather than in the startup packet, which a pooler refuses
    (pgbouncer: "unsupported startup parameter") or drops (ignore_startup_parameters)."""
    if limits is None:
        return
    settings = limits.settings(conn.get_server_version().major)
    # Every value is a number AWP computed: nothing to quote.
    await conn.execute("; ".join(f"SET {name} = {value}" for name, value in settings.items()))


async def init_connection(conn: asyncpg.Connection) -> None:
    keep_alive(conn)
    # jsonb travels as Python objects; json.dumps/loads are the C-accelerated codecs.
    # Built-in types: no query, so nothing here depends on the backend behind a pooler.
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing beyond what asyncpg always does (roll back an open transaction).

    asyncpg's default reset runs `pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL` on every release: one more round trip and one more transaction per
    borrowed connection, i.e. per RPC. AWP never keeps session state on a pooled
    connection (LISTEN and the migrations' advisory lock live on dedicated connections;
    the limits are set once per connection and never changed; any other setting is
    local to its transaction), so there is nothing to reset. Keep it that way: it
    is also what lets the pool run behind a transaction pooler.
    """


async def create_pool(
    dsn: str,
    min_size: int = 2,
    max_size: int = 10,
    *,
    application_name: str = "awp",
    limits: SessionLimits = DEFAULT_LIMITS,
    mode: PoolMode = PoolMode.SESSION,
    **kwargs: Any,
) -> Pool:
    """A pool over dsn. In TRANSACTION mode its connections carry no session settings
    (the backends' own, from their role, apply: awp_db.pooler.check_limits) and no
    statement cache: a named prepared statement lives on the backend that prepared it,
    while its next use may run on another ("prepared statement ... does not exist").
    Uncached, asyncpg re-sends every statement unnamed with each execution."""
    session = mode is PoolMode.SESSION

    async def init(conn: asyncpg.Connection) -> None:
        await init_connection(conn)
        if session:
            await set_limits(conn, limits)

    if not session:
        kwargs["statement_cache_size"] = 0
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init,
        reset=_keep_session,
        # The one startup parameter poolers pass on (pgbouncer tracks it per client).
        server_settings={"application_name": application_name},
        max_cached_statement_lifetime=STATEMENT_LIFETIME_S,
        **kwargs,
    )
    if pool is None:  # pragma: no cover - asyncpg returns None only without awaiting
        raise RuntimeError("asyncpg did not create a pool")
    return pool


async def connect(
    dsn: str, application_name: str = "awp", limits: SessionLimits | None = DEFAULT_LIMITS
) -> asyncpg.Connection:
    """A dedicated connection: a session of its own (behind a pooler, the dsn must lead to
    one in session mode: --session-database-url). limits=None only for work that may
    legitimately wait long (migrations queue on an advisory lock and may rewrite big
    tables)."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, server_settings={"application_name": application_name}
    )
    await init_connection(conn)
    await set_limits(conn, limits)
    return conn
