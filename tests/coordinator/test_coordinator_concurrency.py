"""Two coordinators at once (no leadership): every pass stays correct, nothing is done
twice and no limit is exceeded. Leadership (the leader lease) is for efficiency only."""

from __future__ import annotations

import asyncio
import random

from coordinator_support import coordinator

from awp_db import coordination, runs
from awp_db.connect import Pool, connect
from kit import poll_until, spec, start_run
from kit.db import DbWorker, register, run_state
from kit.invariants import check_committed


async def test_concurrent_passes_keep_the_database_consistent(pool: Pool) -> None:
    global_limit = 9
    rng = random.Random(11)
    run_ids = [
        await start_run(
            pool,
            spec(
                f"r{i}",
                12,
                concurrency=(0, 2, 3)[i % 3],
                max_attempts=3,
                depends={4: [0, 1], 8: [4]},
            ),
        )
        for i in range(6)
    ]
    fleet: list[DbWorker] = [
        await register(pool, grants=False, max_concurrency=2, name="steady"),
        await register(pool, grants=False, max_concurrency=3, name="busy"),
        await register(
            pool, grants=False, max_concurrency=2, name="flaky"
        ),  # lets its leases expire
    ]
    first = coordinator(pool, global_dispatch_limit=global_limit)
    second = coordinator(pool, global_dispatch_limit=global_limit)
    canceled = run_ids[1]
    dispatched = 0

    for round_ in range(300):
        reports = await asyncio.gather(first.run_pass(), second.run_pass())
        dispatched += sum(r.dispatched for r in reports)
        await check_committed(pool, global_limit=global_limit)
        if round_ == 5:
            # A run still running (one may have failed for good by now: the flaky
            # worker's expired leases are charged attempts).
            for run_id in run_ids[1:]:
                if await run_state(pool, run_id) == "running":
                    canceled = run_id
                    break
            async with pool.acquire() as conn:
                await runs.request_cancel(conn, canceled, "test", "test")
        held = []
        for worker in fleet:
            ttl = 30 if worker is fleet[2] else 60_000
            held.extend((worker, lease) for lease in await worker.claim(rng.randint(1, 3), ttl))
        await check_committed(pool, global_limit=global_limit)
        for worker, lease in held:
            if worker is fleet[2]:
                continue  # never completes: the reaper settles these
            outcome = "failed" if rng.random() < 0.1 else "succeeded"
            assert await worker.complete(lease, outcome) in ("ACCEPTED", "LEASE_LOST")
        if all([await run_state(pool, run_id) != "running" for run_id in run_ids]):
            break
    else:
        raise AssertionError("runs did not finish")

    await check_committed(pool, global_limit=global_limit, finished=True)
    assert await run_state(pool, canceled) == "canceled"
    # Each attempt ended exactly once, by exactly one writer.
    doubled = await pool.fetch(
        """SELECT run_id, task_key, attempt, count(*) FROM state_events
            WHERE type = 'attempt.state' AND from_state = 'running'
            GROUP BY run_id, task_key, attempt HAVING count(*) > 1"""
    )
    assert not doubled
    # Every dispatch created is accounted for once (the unique index would refuse a
    # second live one; this checks nothing was created and silently dropped).
    assert await pool.fetchval("SELECT count(*) FROM dispatches") == dispatched
    # The flaky worker's leases were reaped, not lost.
    assert await pool.fetchval("SELECT count(*) FROM attempts WHERE state = 'interrupted'") > 0


async def test_two_reapers_settle_each_expired_lease_once(pool: Pool, database_dsn: str) -> None:
    run_ids = [await start_run(pool, spec(f"e{i}", 5, backoff_ms=60_000)) for i in range(4)]
    worker = await register(pool, max_concurrency=20)
    await coordinator(pool).run_pass()
    held = await worker.claim(20, ttl_ms=50)
    assert len(held) == 20
    last = max(lease.lease_expires_at for lease in held)

    async def expired() -> bool:
        passed: bool = await pool.fetchval("SELECT clock_timestamp() > $1", last)
        return passed

    await poll_until(expired)

    a, b = await connect(database_dsn), await connect(database_dsn)
    try:
        left, right = await asyncio.gather(
            coordination.reap_expired(a, limit=20), coordination.reap_expired(b, limit=20)
        )
    finally:
        await a.close()
        await b.close()

    assert left.interrupted + right.interrupted == 20
    assert await pool.fetchval("SELECT count(*) FROM attempts WHERE state = 'interrupted'") == 20
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE state = 'waiting_retry'") == 20
    for run_id in run_ids:
        assert await run_state(pool, run_id) == "running"
    await check_committed(pool)
