"""Dispatch: only for compatible active workers, within every limit, fair across runs."""

from __future__ import annotations

import asyncio
import random

from coordinator_support import coordinator

from awp_db.connect import Pool
from kit import spec, start_run
from kit.db import DbWorker, register, run_state, task_states
from kit.invariants import check_committed


async def test_no_dispatch_without_a_compatible_active_worker(pool: Pool) -> None:
    run_id = await start_run(pool, spec("lonely", 3))
    coord = coordinator(pool)
    await register(pool, grants=False, kinds=["python"])  # active, but cannot run 'mock' tasks

    report = await coord.run_pass()

    assert report.dispatched == 0
    assert await pool.fetchval("SELECT count(*) FROM dispatches") == 0
    assert set((await task_states(pool, run_id)).values()) == {"ready"}

    # A compatible worker that registers later gets the work.
    worker = await register(pool, grants=False, kinds=["mock"], max_concurrency=2)
    report = await coord.run_pass()
    assert report.dispatched == 2  # no more than its free slots are offered
    claimed = await worker.claim()
    assert len(claimed) == 2
    assert sorted((await task_states(pool, run_id)).values()) == ["ready", "running", "running"]
    await check_committed(pool)


async def test_prefetch_offers_a_refill_beyond_the_free_slots(pool: Pool) -> None:
    """With prefetch 1.0 a full worker's next leases are already offered, so its freed
    slots are refilled without waiting for a pass; a claim never exceeds them."""
    await start_run(pool, spec("ahead", 9))
    worker = await register(pool, grants=False, max_concurrency=2)
    coord = coordinator(pool, dispatch_prefetch=1.0)

    assert (await coord.run_pass()).dispatched == 4  # 2 free slots + 2 offered ahead
    first = await worker.claim(5)
    assert len(first) == 2
    assert (await coord.run_pass()).dispatched == 0  # full, and 2 are already ahead
    assert await worker.claim(5) == []
    for lease in first:
        assert await worker.complete(lease) == "ACCEPTED"
    assert len(await worker.claim(5)) == 2  # no pass in between
    await check_committed(pool)


async def test_prefetch_is_topped_up_once_half_of_it_is_taken(pool: Pool) -> None:
    """Offers are refilled before they run out, so claims made while a refill is under
    way still get every slot they ask for; not after every result either."""
    run_id = await start_run(pool, spec("topped", 30))
    worker = await register(pool, grants=False, max_concurrency=4)
    coord = coordinator(pool, dispatch_prefetch=1.0)
    assert (await coord.run_pass()).dispatched == 8  # 4 free slots + 4 offered ahead
    held = await worker.claim(4)
    assert len(held) == 4

    async def cycle(n: int) -> None:
        """n results accepted, then n leases claimed from the offers, no pass between."""
        for lease in held[:n]:
            assert await worker.complete(lease) == "ACCEPTED"
        del held[:n]
        claimed = await worker.claim(n)
        assert len(claimed) == n
        held.extend(claimed)

    await cycle(1)  # 3 offers left, the mark is 0 free + 2
    assert (await coord.run_pass()).dispatched == 0
    await cycle(2)  # 1 offer left: below the mark, though no free slot lacks an offer
    report = await coord.run_pass()
    assert report.dispatched == 3  # back to 0 free + 4 ahead
    states = list((await task_states(pool, run_id)).values())
    assert (states.count("running"), states.count("queued")) == (4, 4)
    await check_committed(pool)


async def test_prefetch_stays_within_the_run_concurrency(pool: Pool) -> None:
    run_id = await start_run(pool, spec("narrow", 9, concurrency=3))
    worker = await register(pool, grants=False, max_concurrency=2)
    coord = coordinator(pool, dispatch_prefetch=1.0)

    assert (await coord.run_pass()).dispatched == 3  # room for 4, the run allows 3
    first = await worker.claim(5)
    assert len(first) == 2
    assert (await coord.run_pass()).dispatched == 0
    for lease in first:
        assert await worker.complete(lease) == "ACCEPTED"
    assert len(await worker.claim(5)) == 1
    assert (await coord.run_pass()).dispatched == 2
    states = list((await task_states(pool, run_id)).values())
    assert states.count("queued") + states.count("running") == 3
    await check_committed(pool)


async def test_a_draining_worker_is_not_capacity(pool: Pool) -> None:
    await start_run(pool, spec("drained", 2))
    worker = await register(pool, grants=False)
    outcome = await worker.drain()
    assert outcome.state == "stopped"

    report = await coordinator(pool).run_pass()

    assert report.dispatched == 0


async def test_queued_task_whose_kind_loses_its_last_worker_goes_back_to_ready(
    pool: Pool,
) -> None:
    run_id = await start_run(pool, spec("orphaned", 2))
    worker = await register(pool, grants=False, max_concurrency=5)
    coord = coordinator(pool)
    assert (await coord.run_pass()).dispatched == 2
    assert set((await task_states(pool, run_id)).values()) == {"queued"}

    await worker.drain()  # no leases: straight to stopped
    report = await coord.run_pass()

    assert report.withdrawn == 2
    assert report.dispatched == 0
    rows = await pool.fetch("SELECT state, attempts FROM tasks WHERE run_id = $1", run_id)
    assert [(r["state"], r["attempts"]) for r in rows] == [("ready", 0), ("ready", 0)]
    assert await pool.fetchval("SELECT count(*) FROM attempts") == 0
    assert await pool.fetchval(
        "SELECT array_agg(DISTINCT state) FROM dispatches WHERE run_id = $1", run_id
    ) == ["expired"]
    await check_committed(pool)

    # And the next compatible worker picks the tasks up again, nothing spent.
    newcomer = await register(pool, grants=False)
    assert (await coord.run_pass()).dispatched == 2
    leases = await newcomer.claim()
    assert sorted(lease.attempt for lease in leases) == [1, 1]


async def test_limits_hold_throughout_a_run(pool: Pool) -> None:
    """Claim/complete cycles against three runs and three workers; after every step the
    global limit, each run's concurrency and each worker's slots hold."""
    global_limit = 7
    rng = random.Random(7)
    run_ids = [
        await start_run(pool, spec("narrow", 12, concurrency=2)),
        await start_run(pool, spec("wider", 15, concurrency=5, depends={5: [0, 1]})),
        await start_run(pool, spec("open", 10, max_attempts=2)),
    ]
    fleet: list[DbWorker] = [
        await register(pool, grants=False, max_concurrency=1, name="a"),
        await register(pool, grants=False, max_concurrency=3, name="b"),
        await register(pool, grants=False, max_concurrency=4, name="c"),
    ]
    coord = coordinator(pool, global_dispatch_limit=global_limit)
    peak = 0
    for _ in range(400):
        await coord.run_pass()
        counts = await check_committed(pool, global_limit=global_limit)
        peak = max(peak, counts["live"])
        held = []
        for worker in fleet:
            held.extend((worker, lease) for lease in await worker.claim(rng.randint(1, 3)))
            await check_committed(pool, global_limit=global_limit)
        for worker, lease in held:
            outcome = "failed" if rng.random() < 0.15 else "succeeded"
            answer = await worker.complete(lease, outcome)
            # A run that failed for good (a task out of attempts) ended its other tasks'
            # leases: only those may be lost.
            if answer != "ACCEPTED":
                assert (answer, await run_state(pool, lease.run_id)) == ("LEASE_LOST", "failed")
        await check_committed(pool, global_limit=global_limit)
        if all([await run_state(pool, run_id) != "running" for run_id in run_ids]):
            break
    else:
        raise AssertionError("runs did not finish")
    await check_committed(pool, global_limit=global_limit, finished=True)
    assert peak == global_limit  # the limit was actually reached, not trivially held


async def test_an_old_large_run_cannot_starve_a_new_small_one(pool: Pool) -> None:
    """Global limit 1: the 200-task run is in progress, a new 2-task run still gets
    every other dispatch, also after a coordinator restart."""
    big = await start_run(pool, spec("big", 200))
    worker = await register(pool, grants=False, max_concurrency=5)
    coord = coordinator(pool, global_dispatch_limit=1)

    async def cycle() -> str:
        """One dispatch, claimed and completed: which run it served."""
        report = await coord.run_pass()
        assert report.dispatched == 1
        (lease,) = await worker.claim()
        assert await worker.complete(lease) == "ACCEPTED"
        return "big" if lease.run_id == big else "small"

    for _ in range(10):
        assert await cycle() == "big"
    small = await start_run(pool, spec("small", 2))
    served = [await cycle() for _ in range(4)]
    assert served.count("small") == 2, served
    assert served[0] == "small"  # never dispatched yet: first in line
    assert await run_state(pool, small) == "succeeded"

    # A restart keeps fairness: it lives in the database, not in the coordinator.
    later = await start_run(pool, spec("later", 2))
    coord = coordinator(pool, global_dispatch_limit=1)
    served = [await cycle() for _ in range(4)]
    assert served.count("small") == 2  # 'later' is the one that is not 'big'
    assert await run_state(pool, later) == "succeeded"
    assert await run_state(pool, big) == "running"
    await check_committed(pool, global_limit=1)


async def test_a_busy_run_is_left_to_the_next_pass_not_waited_for(pool: Pool) -> None:
    busy = await start_run(pool, spec("busy", 2))
    idle = await start_run(pool, spec("idle", 2))
    await register(pool, grants=False, max_concurrency=10)
    coord = coordinator(pool)
    async with pool.acquire() as holder, holder.transaction():
        # Another transaction (a claim, a result) holds the busy run's row.
        await holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", busy)
        report = await asyncio.wait_for(coord.run_pass(), 10)
        assert report.dispatched == 2
        assert set((await task_states(pool, idle)).values()) == {"queued"}
        assert set((await task_states(pool, busy)).values()) == {"ready"}
    # Once the run is free again, the next pass serves it.
    assert (await coord.run_pass()).dispatched == 2
    assert set((await task_states(pool, busy)).values()) == {"queued"}
    await check_committed(pool)


async def test_when_every_run_is_busy_the_pass_waits_for_them(pool: Pool) -> None:
    only = await start_run(pool, spec("only", 2))
    await register(pool, grants=False, max_concurrency=10)
    coord = coordinator(pool)
    async with pool.acquire() as holder:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", only)
        passing = asyncio.create_task(coord.run_pass())
        await asyncio.sleep(0.3)
        assert not passing.done()  # a single busy run: waiting is the only way forward
        await transaction.rollback()
        assert (await asyncio.wait_for(passing, 10)).dispatched == 2
