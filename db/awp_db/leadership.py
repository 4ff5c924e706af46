"""The coordinator leader's lease: a row on the database clock with an epoch
(DESIGN.md §7, docs/leadership.md).

A coordinator leads for one term, (holder, epoch), from an acquisition until the lease
expires unrenewed or it resigns; the next acquisition starts the next epoch. Every
transaction a leader runs is opened with `transaction(conn, term)`, whose first lock
checks that the term still holds (locks.leader_term): a leader that was stopped, paused
or cut off and then resumes finds its term superseded and writes nothing. Leadership
is still only an efficiency device: with `term=None` every coordinator transaction is
correct with any number of coordinators at once.

Nothing here uses session state (no session advisory lock, no dedicated connection), so
any pooled connection serves, behind a transaction pooler too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

from awp_db import locks
from awp_db.connect import Conn, Pool
from awp_db.queries import queries, row_as

Q = queries("leadership")


@dataclass(frozen=True, slots=True)
class Term:
    """One coordinator's leadership: its name, the epoch it acquired, and the lease length
    (also the longest a leader transaction may sit idle: locks.leader_term)."""

    holder: str
    epoch: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try for the lease: the new epoch if this holder took it (None if not); and the
    lease as it stood before the try: its holder ('' if nobody ever led), and seconds
    until it expired (negative once past)."""

    epoch: int | None
    holder: str
    expires_in: float


@dataclass(frozen=True, slots=True)
class Lease:
    """The live lease (for operators and tests)."""

    holder: str
    epoch: int
    acquired_at: datetime
    expires_in: float


class Superseded(Exception):
    """A leader transaction found its term over: another coordinator leads now (or the
    lease was taken over after it expired). Nothing of the transaction was written."""

    def __init__(self, term: Term) -> None:
        super().__init__(f"epoch {term.epoch} of {term.holder!r} is no longer the leader's")
        self.term = term


async def acquire(
    conn: Conn | Pool, holder: str, ttl_ms: int, global_dispatch_limit: int = 0
) -> Attempt:
    """One try at the lease; a winner publishes its global dispatch limit with it, which
    every grant keeps (awp_db.dispatching)."""
    attempt = await row_as(Attempt, conn, Q["acquire"], holder, ttl_ms, global_dispatch_limit)
    assert attempt is not None, "migration 0004 inserts the leader row"
    return attempt


async def renew(conn: Conn | Pool, term: Term) -> bool:
    """Extends the lease by term.ttl_ms from now; False once the term is over."""
    renewed = await conn.fetchval(Q["renew"], term.holder, term.epoch, term.ttl_ms)
    return renewed is not None


async def resign(conn: Conn | Pool, term: Term) -> bool:
    """Ends the lease now (a clean stop); False if the term was already over."""
    resigned = await conn.fetchval(Q["resign"], term.holder, term.epoch)
    return resigned is not None


async def current(conn: Conn | Pool) -> Lease | None:
    return await row_as(Lease, conn, Q["current"])


@asynccontextmanager
async def transaction(conn: Conn, term: Term | None) -> AsyncIterator[None]:
    """A transaction that writes only while `term` leads (raises Superseded otherwise);
    term None: no check, for passes run without leadership."""
    async with conn.transaction():
        if term is not None and not await locks.leader_term(
            conn, term.holder, term.epoch, term.ttl_ms
        ):
            raise Superseded(term)
        yield
