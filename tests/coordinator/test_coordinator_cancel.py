"""Cancellation converges from the persisted intent, whenever a coordinator runs."""

from __future__ import annotations

import asyncio

from coordinator_support import coordinator

from awp_db import leases, runs
from awp_db.connect import Pool
from kit import poll_until, spec, start_run
from kit.db import register, run_state, task_states
from kit.invariants import check_committed


async def test_a_cancel_committed_while_no_coordinator_runs_converges_when_one_starts(
    pool: Pool, database_dsn: str
) -> None:
    run_id = await start_run(pool, spec("canceled", 4, depends={3: [0]}))
    worker = await register(pool, max_concurrency=2)
    await coordinator(pool).run_pass()
    (running,) = await worker.claim(1)
    other = await start_run(pool, spec("bystander", 1))
    # Now: one task of the run running, one queued (a pending dispatch), one ready, one
    # pending. No coordinator is running when the cancel is committed.
    async with pool.acquire() as conn:
        assert await runs.request_cancel(conn, run_id, "user asked", "test")
    before = await task_states(pool, run_id)
    assert sorted(before.values()) == ["pending", "queued", "ready", "running"]

    async def canceled() -> bool:
        return await run_state(pool, run_id) == "canceled"

    # A long scan interval: convergence must come from starting, not from a later tick.
    coord = coordinator(pool, database_dsn, scan_interval_s=30.0)
    stop = asyncio.Event()
    loop = asyncio.create_task(coord.run(stop))
    try:
        await poll_until(canceled)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 20)

    assert set((await task_states(pool, run_id)).values()) == {"canceled"}
    assert await pool.fetchval(
        "SELECT array_agg(DISTINCT state) FROM dispatches WHERE run_id = $1", run_id
    ) == ["canceled"]
    assert await pool.fetchval("SELECT state FROM attempts WHERE run_id = $1", run_id) == (
        "canceled"
    )
    # The worker still executing hears REVOKED; its late result is fenced.
    async with pool.acquire() as conn:
        ref = leases.LeaseRef(running.dispatch_id, running.lease_token)
        (answer,) = await leases.renew(conn, worker.id, [ref], 60_000)
    assert answer.status == "revoked"
    assert await worker.complete(running) == "LEASE_LOST"
    # Another run is untouched.
    assert await run_state(pool, other) == "running"
    await check_committed(pool)


async def test_a_run_being_canceled_gets_no_new_dispatch(pool: Pool) -> None:
    run_id = await start_run(pool, spec("stopping", 3))
    await register(pool)
    async with pool.acquire() as conn:
        await runs.request_cancel(conn, run_id, "", "test")

    coord = coordinator(pool)
    # Cancellation comes first in a pass, so dispatch never sees the run as live.
    report = await coord.run_pass()

    assert (report.canceled_runs, report.dispatched) == (1, 0)
    assert await run_state(pool, run_id) == "canceled"
    assert await pool.fetchval("SELECT count(*) FROM dispatches") == 0
    events = await pool.fetch(
        "SELECT type, to_state FROM state_events WHERE run_id = $1 ORDER BY seq", run_id
    )
    assert (events[-1]["type"], events[-1]["to_state"]) == ("run.state", "canceled")
    assert not (await coord.run_pass()).did_work
    await check_committed(pool, finished=True)


async def test_concurrent_convergence_cancels_once(pool: Pool) -> None:
    run_ids = [await start_run(pool, spec(f"many{i}", 3)) for i in range(6)]
    worker = await register(pool, max_concurrency=20)
    await coordinator(pool).run_pass()
    await worker.claim(6)
    for run_id in run_ids:
        async with pool.acquire() as conn:
            await runs.request_cancel(conn, run_id, "", "test")

    first, second = coordinator(pool), coordinator(pool)
    counts = await asyncio.gather(first.converge_cancels(), second.converge_cancels())

    assert sum(counts) == 6
    for run_id in run_ids:
        assert await run_state(pool, run_id) == "canceled"
        finals = await pool.fetchval(
            """SELECT count(*) FROM state_events
                WHERE run_id = $1 AND type = 'run.state' AND to_state = 'canceled'""",
            run_id,
        )
        assert finals == 1
    await check_committed(pool, finished=True)
