"""The leader lease over a real PostgreSQL (awp_db.leadership, migration 0004): acquire,
renew, expire and resign on the database clock; every acquisition a new epoch; a
superseded term can neither renew nor write; a takeover waits for the old leader's open
transactions, which a stalled leader cannot keep open for longer than the lease."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from awp_db import leadership, locks
from awp_db.connect import Pool, connect
from awp_db.leadership import Superseded, Term
from kit import poll_until

TTL_MS = 60_000


async def _expire(pool: Pool) -> None:
    """The lease runs out (as if its holder had stopped renewing it a whole ttl ago)."""
    await pool.execute("UPDATE coordinator_leader SET expires_at = clock_timestamp()")


async def _term(pool: Pool, holder: str, ttl_ms: int = TTL_MS) -> Term:
    attempt = await leadership.acquire(pool, holder, ttl_ms)
    assert attempt.epoch is not None, f"{holder} did not get the lease: {attempt}"
    return Term(holder, attempt.epoch, ttl_ms)


async def test_acquire_renew_expire_resign_each_acquisition_a_new_epoch(pool: Pool) -> None:
    assert await leadership.current(pool) is None  # nobody has led yet

    first = await leadership.acquire(pool, "a", TTL_MS)
    assert first.epoch == 1
    assert first.holder == ""
    lease = await leadership.current(pool)
    assert lease is not None
    assert (lease.holder, lease.epoch) == ("a", 1)
    assert TTL_MS / 1000 - 5 < lease.expires_in <= TTL_MS / 1000

    # While the lease is live nobody else takes it, and learns whose it is and for how long.
    refused = await leadership.acquire(pool, "b", TTL_MS)
    assert refused.epoch is None
    assert refused.holder == "a"
    assert 0 < refused.expires_in <= TTL_MS / 1000
    # Not even its own holder acquires it twice: a second term would fence the first.
    assert (await leadership.acquire(pool, "a", TTL_MS)).epoch is None

    a = Term("a", 1, TTL_MS)
    assert await leadership.renew(pool, a)
    # A renewal names the term exactly: another holder or another epoch renews nothing.
    assert not await leadership.renew(pool, Term("b", 1, TTL_MS))
    assert not await leadership.renew(pool, Term("a", 2, TTL_MS))

    # Expired but not taken: the same term renews it (nobody else led in between).
    await _expire(pool)
    assert await leadership.current(pool) is None
    assert await leadership.renew(pool, a)
    assert (await leadership.acquire(pool, "b", TTL_MS)).epoch is None

    # Expired and taken: the next epoch, and the old term is over for good.
    await _expire(pool)
    taken = await leadership.acquire(pool, "b", TTL_MS)
    assert (taken.epoch, taken.holder) == (2, "a")
    b = Term("b", 2, TTL_MS)
    assert not await leadership.renew(pool, a)
    assert not await leadership.resign(pool, a)
    lease = await leadership.current(pool)
    assert lease is not None
    assert (lease.holder, lease.epoch) == ("b", 2)

    # A clean stop ends the lease at once; the next acquisition is epoch 3.
    assert await leadership.resign(pool, b)
    assert await leadership.current(pool) is None
    again = await leadership.acquire(pool, "a", TTL_MS)
    assert (again.epoch, again.holder) == (3, "b")


async def test_a_lease_left_unrenewed_expires_on_the_database_clock(pool: Pool) -> None:
    await _term(pool, "a", ttl_ms=300)
    acquired_at = await pool.fetchval("SELECT acquired_at FROM coordinator_leader")

    async def taken() -> leadership.Attempt | None:
        attempt = await leadership.acquire(pool, "b", 300)
        return attempt if attempt.epoch is not None else None

    attempt = await poll_until(taken, "b to take the expired lease", within=10)
    assert attempt.epoch == 2
    took = await pool.fetchval("SELECT acquired_at FROM coordinator_leader") - acquired_at
    assert took.total_seconds() >= 0.3


async def test_a_superseded_term_writes_nothing(pool: Pool) -> None:
    await pool.execute("CREATE TABLE written (term text)")
    a = await _term(pool, "a")
    async with pool.acquire() as conn:
        async with leadership.transaction(conn, a):
            await conn.execute("INSERT INTO written VALUES ('a, leading')")
        await _expire(pool)
        b = await _term(pool, "b")
        with pytest.raises(Superseded) as refused:
            async with leadership.transaction(conn, a):
                await conn.execute("INSERT INTO written VALUES ('a, superseded')")
        assert refused.value.term == a
        async with leadership.transaction(conn, b):
            await conn.execute("INSERT INTO written VALUES ('b')")
        # Without a term (passes run outside leadership) nothing is checked.
        async with leadership.transaction(conn, None):
            await conn.execute("INSERT INTO written VALUES ('none')")
    rows = await pool.fetch("SELECT term FROM written ORDER BY term")
    assert [row["term"] for row in rows] == ["a, leading", "b", "none"]


async def _waiting_for_a_lock(pool: Pool, conn: asyncpg.Connection) -> bool:
    event: str | None = await pool.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", conn.get_server_pid()
    )
    return event == "Lock"


async def test_a_takeover_waits_for_the_old_terms_open_transaction_and_fences_it(
    pool: Pool, conn: asyncpg.Connection
) -> None:
    a = await _term(pool, "a")
    async with pool.acquire() as leader:
        transaction = leader.transaction()
        await transaction.start()
        assert await locks.leader_term(leader, a.holder, a.epoch, a.ttl_ms)
        # Its own renewals never wait for a leader's transactions...
        async with asyncio.timeout(5):
            assert await leadership.renew(conn, a)
        # ...a takeover does, once the lease has expired.
        await _expire(pool)
        takeover = asyncio.create_task(leadership.acquire(conn, "b", TTL_MS))
        await poll_until(lambda: _waiting_for_a_lock(pool, conn), "the takeover to wait")
        assert not takeover.done()
        # What the old term wrote before the takeover committed is the old term's.
        await leader.execute("CREATE TABLE written (term text)")
        await transaction.commit()
        assert (await asyncio.wait_for(takeover, 10)).epoch == 2
        # From now on the old term's transactions write nothing.
        with pytest.raises(Superseded):
            async with leadership.transaction(leader, a):
                await leader.execute("INSERT INTO written VALUES ('a')")
    assert await pool.fetchval("SELECT count(*) FROM written") == 0


async def test_a_stalled_leader_cannot_hold_a_takeover_off_past_the_lease(
    pool: Pool, database_dsn: str, conn: asyncpg.Connection
) -> None:
    a = await _term(pool, "a", ttl_ms=300)
    stalled = await connect(database_dsn)
    try:
        # The leader stops mid-transaction (SIGSTOP, a partition): its backend sits idle
        # in the transaction, holding the term...
        transaction = stalled.transaction()
        await transaction.start()
        assert await locks.leader_term(stalled, a.holder, a.epoch, a.ttl_ms)

        async def taken() -> leadership.Attempt | None:
            # Waits behind the stalled transaction: bounded, so a failure cannot hang.
            async with asyncio.timeout(2):
                attempt = await leadership.acquire(conn, "b", TTL_MS)
            return attempt if attempt.epoch is not None else None

        # ...until PostgreSQL ends the session after the lease length; then b leads.
        attempt = await poll_until(
            taken, "b to take over from the stalled leader", within=15, tolerate=(TimeoutError,)
        )
        assert attempt.epoch == 2

        # It was PostgreSQL ending the stalled session that released the term.
        async def ended() -> bool:
            count: int = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", stalled.get_server_pid()
            )
            return count == 0

        await poll_until(ended, "the stalled session to end")
    finally:
        stalled.terminate()
