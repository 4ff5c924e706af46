"""The lock order (awp_db.locks), cycle by cycle: each test holds what one side of a
deadlock once held and shows the other side no longer closes the cycle.

- A renewal once locked its leases in the order its plan visited them and met its own
  worker's Complete locking them in id order (CI, while retention churned the tables).
  A renewal now holds no lease while it waits for another.
- A settlement's stop of a failed run locks the run's other leases after the one it
  settles; a heartbeat renewing both deadlocked with it.
- A failure's traceback, written by a second UPDATE of its attempt, made PostgreSQL check
  the attempt's foreign keys again: FOR KEY SHARE on the worker's row, which a Claim of
  that worker held FOR UPDATE while it waited for the run the settlement held (issue 25).
- No lock of the order conflicts with a foreign-key check at all.
- A lost stream's shortening, like a renewal, holds no lease while it waits for another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from awp_db import leases, locks, settle, workers
from awp_db.connect import Conn, Pool, connect
from awp_db.events import EventBatch
from awp_db.leases import LeaseRef
from awp_kernel.fencing import ResultVerdict
from kit import poll_until, spec, start_run
from kit.db import register


async def _waits_for_a_lock(pool: Pool, pid: int) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            pid,
        )
    )


@pytest.fixture
async def holder(database_dsn: str) -> AsyncIterator[Conn]:
    """A connection whose transaction holds what the other side of a cycle held."""
    conn = await connect(database_dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def _locked(conn: Conn, query: str, *args: object) -> bool:
    """Whether this connection can take the lock right now (NOWAIT)."""
    try:
        await conn.execute(query + " NOWAIT", *args)
    except asyncpg.LockNotAvailableError:
        return False
    return True


async def test_a_renewal_waits_for_a_busy_lease_holding_no_other(
    pool: Pool, database_dsn: str, holder: Conn
) -> None:
    await start_run(pool, spec("two", 2))
    worker = await register(pool, name="w1")
    low, high = sorted(await worker.dispatch_and_claim(), key=lambda lease: lease.dispatch_id)
    # A sequential scan now meets the higher id first: the update puts the lower row's
    # live version behind it in the table.
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = lease_expires_at WHERE id = $1",
        low.dispatch_id,
    )
    renewer = await connect(database_dsn)
    try:
        # The plan that visits rows in table order, not the primary key's.
        await renewer.execute("SET enable_indexscan = off")
        await renewer.execute("SET enable_bitmapscan = off")
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT 1 FROM dispatches WHERE id = $1 FOR UPDATE", high.dispatch_id)
        refs = [LeaseRef(lease.dispatch_id, lease.lease_token) for lease in (low, high)]
        renewal = asyncio.create_task(leases.renew(renewer, worker.worker_id, refs, 15_000))
        pid = renewer.get_server_pid()
        await poll_until(lambda: _waits_for_a_lock(pool, pid), "the renewal to wait", within=10)
        # Waiting for the busy lease, the renewal holds the other one no longer.
        lock = "SELECT 1 FROM dispatches WHERE id = $1 FOR NO KEY UPDATE"
        assert await _locked(holder, lock, low.dispatch_id)
        await held.rollback()
        answers = await asyncio.wait_for(renewal, 10)
        assert [answer.status for answer in answers] == ["renewed", "renewed"]
    finally:
        await renewer.close()


async def test_stopping_a_failed_run_does_not_deadlock_with_its_workers_heartbeat(
    pool: Pool, database_dsn: str, holder: Conn
) -> None:
    run_id = await start_run(pool, spec("two", 2, max_attempts=1))
    worker = await register(pool, name="w1")
    low, high = sorted(await worker.dispatch_and_claim(), key=lambda lease: lease.dispatch_id)
    renewer = await connect(database_dsn)
    try:
        # A settlement of the higher lease holds its run and that lease...
        settling = holder.transaction()
        await settling.start()
        await locks.runs_of_dispatches(holder, [high.dispatch_id])
        await locks.dispatches_for_settlement(holder, [high.dispatch_id])
        # ...while the worker's heartbeat renews both and waits for the higher one.
        refs = [LeaseRef(lease.dispatch_id, lease.lease_token) for lease in (low, high)]
        renewal = asyncio.create_task(leases.renew(renewer, worker.worker_id, refs, 15_000))
        pid = renewer.get_server_pid()
        await poll_until(lambda: _waits_for_a_lock(pool, pid), "the renewal to wait", within=10)
        # The run fails: its other lease is revoked, which needs the lower row.
        await asyncio.wait_for(
            settle.stop_runs(holder, [run_id], "skipped", EventBatch()), timeout=10
        )
        await settling.commit()
        answers = await asyncio.wait_for(renewal, 10)
        # The lower lease was free, renewed before the stop; the other one waited for it.
        assert [answer.status for answer in answers] == ["renewed", "revoked"]
    finally:
        await renewer.close()


async def test_a_failure_with_a_traceback_settles_while_its_worker_claims(
    pool: Pool, holder: Conn
) -> None:
    await start_run(pool, spec("one", 1, max_attempts=1))
    worker = await register(pool, name="w1")
    (lease,) = await worker.dispatch_and_claim()
    # A Claim of the same worker holds its session row (and would next wait for the run).
    async with holder.transaction():
        assert await locks.session(holder, worker.worker_id) is not None
        result = leases.ResultIn(
            lease.dispatch_id,
            lease.lease_token,
            "failed",
            error_message="boom",
            retryable=False,
            error_type="ValueError",
            traceback="Traceback (most recent call last):\n  ...\nValueError: boom",
            log_tail="the action's last words",
        )
        call = leases.Completion(str(worker.worker_id), worker.session_token, [result])
        async with pool.acquire() as conn:
            (verdicts,) = await asyncio.wait_for(leases.complete_many(conn, [call]), 10)
    assert verdicts == [ResultVerdict.ACCEPTED]
    row = await pool.fetchrow(
        "SELECT state, traceback, log_tail FROM attempts WHERE dispatch_id = $1",
        lease.dispatch_id,
    )
    assert row is not None
    assert (row["state"], row["traceback"], row["log_tail"]) == (
        "failed",
        result.traceback,
        result.log_tail,
    )


async def test_no_lock_of_the_order_keeps_a_foreign_key_check_waiting(
    pool: Pool, holder: Conn
) -> None:
    run_id = await start_run(pool, spec("one", 1))
    worker = await register(pool, name="w1")
    (lease,) = await worker.dispatch_and_claim()
    async with pool.acquire() as checker, holder.transaction():
        # Everything the order takes, as its transactions take it...
        await locks.session(holder, worker.worker_id)
        await locks.sessions(holder, [worker.worker_id])
        await locks.runs(holder, [run_id])
        await locks.runs_of_dispatches(holder, [lease.dispatch_id])
        await locks.dispatches_for_settlement(holder, [lease.dispatch_id])
        assert await locks.lease(holder, lease.dispatch_id, worker.worker_id)
        # ...leaves every foreign-key check (FOR KEY SHARE on the referenced row) free.
        async with checker.transaction():
            for table, key in (
                ("workers", worker.worker_id),
                ("runs", run_id),
                ("dispatches", lease.dispatch_id),
            ):
                share = f"SELECT 1 FROM {table} WHERE id = $1 FOR KEY SHARE"
                assert await _locked(checker, share, key), f"{table} row locked too strongly"


async def test_a_lost_streams_shortening_waits_for_a_busy_lease_holding_no_other(
    pool: Pool, database_dsn: str, holder: Conn
) -> None:
    await start_run(pool, spec("two", 2))
    worker = await register(pool, name="w1")
    low, high = sorted(await worker.dispatch_and_claim(), key=lambda lease: lease.dispatch_id)
    async with pool.acquire() as conn:
        epoch = await workers.open_stream(conn, worker.worker_id)
    assert epoch is not None
    shortener = await connect(database_dsn)
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT 1 FROM dispatches WHERE id = $1 FOR UPDATE", high.dispatch_id)
        shortening = asyncio.create_task(
            leases.stream_lost(shortener, worker.worker_id, epoch, grace_ms=300)
        )
        pid = shortener.get_server_pid()
        await poll_until(lambda: _waits_for_a_lock(pool, pid), "the shortening to wait", within=10)
        lock = "SELECT 1 FROM dispatches WHERE id = $1 FOR NO KEY UPDATE"
        assert await _locked(holder, lock, low.dispatch_id)
        await held.rollback()
        assert await asyncio.wait_for(shortening, 10) == 2
    finally:
        await shortener.close()
