"""Revocation notices (migration 0012, awp_db.revocations): a lease ended by anyone but
its holder's own result NOTIFYs LEASE_REVOKED_CHANNEL with its holder and dispatch, and
the database, not the payload, confirms it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from awp_db import coordination, revocations
from awp_db.connect import Pool, connect
from awp_db.listen import Inbox
from awp_db.signals import LEASE_REVOKED_CHANNEL
from awp_db.workers import OfflineRule
from kit import poll_until, spec, start_run
from kit.db import converge_cancel, register


class Notices:
    def __init__(self) -> None:
        self.payloads: list[str] = []

    def heard(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self.payloads.append(str(payload))


@pytest.fixture
async def notices(database_dsn: str) -> AsyncIterator[Notices]:
    conn: asyncpg.Connection = await connect(database_dsn)
    heard = Notices()
    await conn.add_listener(LEASE_REVOKED_CHANNEL, heard.heard)
    try:
        yield heard
    finally:
        await conn.close()


async def _delivered(pool: Pool) -> None:
    """Everything committed before now has reached the listener: a marker notice sent
    after it arrives after it (PostgreSQL delivers in commit order)."""
    await pool.execute("SELECT pg_notify($1, 'marker')", LEASE_REVOKED_CHANNEL)


async def _heard(notices: Notices, pool: Pool) -> list[str]:
    await _delivered(pool)

    async def marker() -> bool:
        return "marker" in notices.payloads

    await poll_until(marker, within=10)
    heard = [p for p in notices.payloads if p != "marker"]
    notices.payloads.clear()
    return heard


async def test_a_canceled_run_tells_the_holder_of_each_running_lease(
    pool: Pool, notices: Notices
) -> None:
    run_id = await start_run(pool, spec("c", tasks=2))
    worker = await register(pool)
    done, running = await worker.dispatch_and_claim()
    # The holder's own result tells nobody: the holder knows.
    assert await worker.complete(done) == "ACCEPTED"
    assert await _heard(notices, pool) == []

    await converge_cancel(pool, run_id)
    assert await _heard(notices, pool) == [f"{worker.id}:{running.dispatch_id}"]
    async with pool.acquire() as conn:
        told = revocations.parse(f"{worker.id}:{running.dispatch_id}")
        assert told is not None
        assert await revocations.confirmed(conn, [told]) == [told]
        # The payload is only where to look: a completed lease, another holder or a
        # dispatch that does not exist are never confirmed.
        forged = [
            revocations.Revoked(worker.id, done.dispatch_id),
            revocations.Revoked(uuid.uuid4(), running.dispatch_id),
            revocations.Revoked(worker.id, running.dispatch_id + 1000),
        ]
        assert await revocations.confirmed(conn, forged) == []


async def test_a_lease_still_held_is_never_confirmed_revoked(pool: Pool) -> None:
    await start_run(pool, spec("held", tasks=1))
    worker = await register(pool)
    (lease,) = await worker.dispatch_and_claim()
    async with pool.acquire() as conn:
        held = revocations.Revoked(worker.id, lease.dispatch_id)
        assert await revocations.confirmed(conn, [held]) == []


async def test_a_reaped_lease_tells_its_holder(pool: Pool, notices: Notices) -> None:
    await start_run(pool, spec("r", tasks=1))
    worker = await register(pool)
    (lease,) = await worker.dispatch_and_claim()
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE id = $1",
        lease.dispatch_id,
    )
    async with pool.acquire() as conn:
        reaped = await coordination.reap_expired(conn)
    assert reaped.interrupted == 1
    assert await _heard(notices, pool) == [f"{worker.id}:{lease.dispatch_id}"]


async def test_a_session_gone_offline_tells_it_of_its_leases(pool: Pool, notices: Notices) -> None:
    """The session may still have a stream open somewhere (a network split): the
    server holding it pushes REVOKED before the session's next heartbeat is refused."""
    await start_run(pool, spec("o", tasks=1))
    worker = await register(pool)
    (lease,) = await worker.dispatch_and_claim()
    await pool.execute(
        "UPDATE workers SET last_heartbeat_at = now() - interval '1 hour' WHERE id = $1",
        worker.id,
    )
    async with pool.acquire() as conn:
        offline = await coordination.mark_silent_offline(conn, OfflineRule(intervals=3))
    assert offline.workers == [worker.id]
    assert await _heard(notices, pool) == [f"{worker.id}:{lease.dispatch_id}"]


async def test_many_revocations_in_one_transaction_are_one_notice_each(
    pool: Pool, notices: Notices
) -> None:
    run_id = await start_run(pool, spec("many", tasks=20))
    worker = await register(pool, max_concurrency=20)
    issued = await worker.dispatch_and_claim(20)
    assert len(issued) == 20
    await converge_cancel(pool, run_id)
    heard = await _heard(notices, pool)
    assert sorted(heard) == sorted(f"{worker.id}:{lease.dispatch_id}" for lease in issued)


def test_a_malformed_payload_is_refused() -> None:
    assert revocations.parse("not-a-uuid:1") is None
    assert revocations.parse(f"{uuid.uuid4()}:x") is None
    assert revocations.parse("") is None
    worker = uuid.uuid4()
    assert revocations.parse(f"{worker}:42") == revocations.Revoked(worker, 42)


async def test_an_inbox_keeps_payloads_up_to_its_limit_then_says_some_were_missed() -> None:
    inbox = Inbox(limit=2)
    for payload in ("a", "b", "a", "c"):
        inbox.notify(payload)
    assert await inbox.wait(0)
    assert inbox.take() == ({"a", "b"}, True)  # "c" did not fit: the consumer re-reads all
    assert inbox.take() == (set(), False)
    inbox.wake()  # what a reconnect does: anything may have been missed
    assert inbox.take() == (set(), True)
