"""No deadlock and no INTERNAL answer during a scenario (issue 25, DESIGN.md §6).

A deadlock is a transaction PostgreSQL aborted to break a lock cycle; where a handler ran
it, the caller got INTERNAL. Neither may ever happen, whatever a fault scenario does: the
lock order (awp_db.locks) rules out every cycle, and every other error has its own code.

Two witnesses, since neither sees everything: PostgreSQL's tally for the scenario's
database (pg_stat_database.deadlocks: a backend reports it once idle for a moment or when
it exits, so settled_deadlocks waits for every other backend to go first), and the
processes' logs: every INTERNAL the server answers is logged with INTERNAL_MARK
(awp_server.errors.abort), and a deadlock any process met carries DEADLOCK_MARK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import asyncpg

from kit import poll_until
from kit.invariants.common import Db

# What awp_server.errors.abort logs with every INTERNAL answer.
INTERNAL_MARK = "unexpected error in handler"
# PostgreSQL's message (SQLSTATE 40P01), as asyncpg raises it and any log quotes it.
DEADLOCK_MARK = "deadlock detected"
_QUOTED = 300  # characters of a log line a violation quotes


@dataclass(frozen=True, slots=True)
class ScenarioHealth:
    """What a scenario's database and processes saw: the deadlocks PostgreSQL counted in
    the scenario's database, and each process's log by name."""

    deadlocks: int
    logs: Mapping[str, str] = field(default_factory=dict)


async def deadlocks(db: Db) -> int:
    """The deadlocks PostgreSQL has counted in this database so far (those the backends
    have reported yet)."""
    found: int = await db.fetchval(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
    return found


async def settled_deadlocks(dsn: str, *, within: float = 30.0) -> int:
    """Every deadlock of the database, once every other backend of it has gone (a backend
    reports its count when it exits): call it after stopping the processes and closing
    the pools."""
    conn = await asyncpg.connect(dsn)
    try:

        async def alone() -> bool:
            others: int = await conn.fetchval(
                """SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()"""
            )
            return others == 0

        await poll_until(alone, "the database's other backends to exit", within=within)
        return await deadlocks(conn)
    finally:
        await conn.close()


def health_problems(health: ScenarioHealth) -> list[str]:
    """The invariant: no deadlock counted, no INTERNAL answered, no deadlock met."""
    problems = []
    if health.deadlocks:
        problems.append(f"PostgreSQL detected {health.deadlocks} deadlock(s) in the scenario")
    for name, text in health.logs.items():
        for line in text.splitlines():
            if INTERNAL_MARK in line:
                problems.append(f"{name} answered INTERNAL: {line[:_QUOTED]}")
            elif DEADLOCK_MARK in line.lower():
                problems.append(f"{name} met a deadlock: {line[:_QUOTED]}")
    return problems
