"""Running behind a connection pooler in transaction mode (docs/postgres.md).

There a pooled connection is not a session: every transaction may run on another
backend, so the limits AWP sets on each of its sessions (connect.SessionLimits) cannot
be set at all. The backends must carry them from their role; `check_limits` says, once at
start, which of them do not, and the statement that fixes each. `check_modes` refuses to
start a process whose URLs lead somewhere else than its --database-pool-mode says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from awp_db.connect import Pool, PoolMode, SessionLimits
from awp_db.queries import queries, rows_as

log = logging.getLogger("awp.db.pooler")

Q = queries("pooler")

# Rounds of the probe in transaction_pooled: one suffices on an idle pooler; more ride
# out other clients taking the released backend in between.
PROBE_ROUNDS = 3


class PoolerMismatch(Exception):
    """A URL leads to a pooler in transaction mode where AWP needs a session: the process
    refuses to start (one line, naming the setting that fixes it)."""


@dataclass(frozen=True, slots=True)
class LooserLimit:
    """A setting the backends carry that is off, or looser than AWP's limit."""

    name: str
    setting: str
    fix: str


async def check_limits(pool: Pool, limits: SessionLimits) -> list[LooserLimit]:
    """The limits the pooler's backends do not enforce; logged as one warning (AWP still
    serves: fencing keeps every result correct, these limits bound how long one stalled
    process can hold the others up: docs/liveness.md)."""
    async with pool.acquire() as conn:
        waits = limits.waits(conn.get_server_version().major)
        looser = await rows_as(
            LooserLimit, conn, Q["looser_limits"], list(waits), [int(ms) for ms in waits.values()]
        )
    if looser:
        log.warning(
            "session limits not in force behind the transaction pooler: set them on the role",
            extra={
                "settings": ", ".join(f"{limit.name}={limit.setting}" for limit in looser),
                "fix": "; ".join(limit.fix for limit in looser),
            },
        )
    return looser


async def check_modes(database_url: str, session_url: str, mode: PoolMode) -> None:
    """PoolerMismatch when --database-url is a transaction pooler but the pool mode says
    session (named prepared statements would fail on another backend, and the session
    limits would not hold), or when the session URL is one (LISTEN would miss
    notifications, the migrations' advisory lock would not hold)."""
    if mode is PoolMode.SESSION and await transaction_pooled(database_url):
        raise PoolerMismatch(
            "--database-url leads to a pooler in transaction mode (one connection's "
            "statements ran on different backends): give --database-pool-mode transaction "
            "and a --session-database-url (docs/postgres.md)"
        )
    if session_url != database_url and await transaction_pooled(session_url):
        raise PoolerMismatch(
            "--session-database-url leads to a pooler in transaction mode (one connection's "
            "statements ran on different backends): it must lead to PostgreSQL itself or a "
            "session-mode pool (docs/postgres.md)"
        )


async def transaction_pooled(dsn: str) -> bool:
    """Whether dsn leads to a pooler that moves a connection between backends (pgbouncer
    in transaction or statement mode).

    Two connections, a statement each in turn: first, second, first again. Over a session
    (PostgreSQL itself, or a session-mode pool) a connection keeps one backend for its
    whole life and no other open connection shares it, so the first's two statements run
    on one backend and the second's on another, always: the probe can never refuse a
    correct setup. A transaction pooler returns the backend after each statement and
    pgbouncer hands out the most recently released one first (server_round_robin = 0, its
    default), so the second connection's statement runs on the first's backend; with
    round robin the first's next statement moves instead. Either shows. Other ways are
    weaker: the server's port tells a pooler apart but not its mode, `SHOW POOLS` needs
    pgbouncer's admin console and its credentials, a named prepared statement's fate
    differs across pgbouncer versions (1.21 tracks them), and session state set in one
    transaction may well survive on a reused backend. Unprepared statements only
    (statement_cache_size=0), so that the probe itself runs anywhere."""
    first = await _probe_connection(dsn)
    try:
        second = await _probe_connection(dsn)
        try:
            for _ in range(PROBE_ROUNDS):
                before = await first.fetchval(Q["backend_pid"])
                other = await second.fetchval(Q["backend_pid"])
                after = await first.fetchval(Q["backend_pid"])
                if other == before or after != before:
                    log.info(
                        "a pooler in transaction mode",
                        extra={"backends": f"{before}, {other}, {after}"},
                    )
                    return True
        finally:
            await second.close()
    finally:
        await first.close()
    return False


async def _probe_connection(dsn: str) -> asyncpg.Connection:
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, statement_cache_size=0, server_settings={"application_name": "awp pooler probe"}
    )
    return conn
