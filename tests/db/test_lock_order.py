"""Statements that lock several dispatch rows take them in id order (awp_db.locks),
whatever plan PostgreSQL picks for them. A heartbeat's renewal once locked its leases in
the order its plan visited them, met its own worker's Complete locking the same rows in
id order, and the two deadlocked (CI, while retention churned the tables)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from awp_db import leases
from awp_db.connect import Pool, connect
from awp_db.leases import LeaseRef
from kit import poll_until, spec, start_run
from kit.db import register


async def _waits_for_a_lock(pool: Pool, pid: int) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            pid,
        )
    )


async def test_a_renewal_locks_its_leases_in_id_order_whatever_the_plan(
    pool: Pool, database_dsn: str
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
    holder = await connect(database_dsn)
    renewer = await connect(database_dsn)
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT 1 FROM dispatches WHERE id = $1 FOR UPDATE", high.dispatch_id)

        async def renew() -> list[leases.LeaseAnswer]:
            async with renewer.transaction():
                # The plan that visits rows in table order, not the primary key's.
                await renewer.execute("SET LOCAL enable_indexscan = off")
                await renewer.execute("SET LOCAL enable_bitmapscan = off")
                refs = [LeaseRef(lease.dispatch_id, lease.lease_token) for lease in (low, high)]
                return await leases.renew(renewer, worker.worker_id, refs, 15_000)

        renewal = asyncio.create_task(renew())
        pid = renewer.get_server_pid()
        await poll_until(lambda: _waits_for_a_lock(pool, pid), "the renewal to wait", within=10)
        # In id order, the renewal holds the lower row while it waits for the higher one.
        with pytest.raises(asyncpg.LockNotAvailableError):
            await holder.execute(
                "SELECT 1 FROM dispatches WHERE id = $1 FOR UPDATE NOWAIT", low.dispatch_id
            )
        await held.rollback()
        answers = await asyncio.wait_for(renewal, 10)
        assert [answer.status for answer in answers] == ["renewed", "renewed"]
    finally:
        await holder.close()
        await renewer.close()
