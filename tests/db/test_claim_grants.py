"""Granting where the worker waits (docs/design.md §17): a Claim that finds no offer for
its free slots grants ready tasks itself, in its own transaction, through the one grant
rule -- so every limit the coordinator's pass keeps, it keeps too -- and never waits for
the dispatch lock."""

from __future__ import annotations

import asyncio

from awp_db import dispatching, leadership
from awp_db.connect import Pool
from awp_db.signals import DISPATCH_LOCK_KEY
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from kit import poll_until, start_run
from kit.db import register
from kit.invariants import check_committed


def tasks(count: int, *limits: tuple[str, int], name: str = "direct") -> WorkflowSpec:
    return validate(
        WorkflowSpec(
            name=name,
            version=1,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind="mock",
                    action="noop",
                    concurrency_limits=tuple(ConcurrencyLimit(k, m) for k, m in limits),
                )
                for i in range(count)
            ),
        )
    )


async def events(pool: Pool, transition: tuple[str, str]) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM state_events WHERE from_state = $1 AND to_state = $2", *transition
    )
    return count


async def test_a_claim_grants_and_leases_ready_tasks_with_no_coordinator(pool: Pool) -> None:
    run_id = await start_run(pool, tasks(3))
    worker = await register(pool, max_concurrency=2)
    issued = await worker.claim(2)
    assert len(issued) == 2 and {lease.run_id for lease in issued} == {run_id}
    # Both transitions were recorded, as the coordinator's pass and a Claim record them.
    assert await events(pool, ("ready", "queued")) == 2
    assert await events(pool, ("queued", "running")) == 2
    # Granted for the slots that asked, no more: the third task is still ready.
    state = await pool.fetchval("SELECT state FROM tasks WHERE key = 't2'")
    assert state == "ready"
    assert await pool.fetchval("SELECT count(*) FROM dispatches WHERE state = 'pending'") == 0
    await check_committed(pool)


async def test_a_claims_grant_keeps_every_concurrency_key(pool: Pool) -> None:
    await start_run(pool, tasks(6, ("llm", 2)))
    first = await register(pool, max_concurrency=10, name="a")
    second = await register(pool, max_concurrency=10, name="b")
    got = await asyncio.gather(first.claim(10), second.claim(10))
    assert sum(len(leases) for leases in got) == 2
    assert await first.claim(10) == [] and await second.claim(10) == []
    await first.complete_all(got[0], retryable=False)
    await second.complete_all(got[1], retryable=False)
    # The units came back with the leases' ends: the next claims take two more.
    assert len(await first.claim(10)) + len(await second.claim(10)) == 2
    await check_committed(pool)


async def test_a_claims_grant_keeps_the_leaders_global_limit(pool: Pool) -> None:
    attempt = await leadership.acquire(pool, "leader", 60_000, global_dispatch_limit=3)
    assert attempt.epoch is not None
    await start_run(pool, tasks(8))
    worker = await register(pool, max_concurrency=10)
    assert len(await worker.claim(10)) == 3
    assert await worker.claim(10) == []


async def test_a_claim_with_no_offer_left_queues_behind_a_pass_holding_nothing(
    pool: Pool,
) -> None:
    await start_run(pool, tasks(2))
    worker = await register(pool, max_concurrency=2)
    async with pool.acquire() as holder:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT pg_advisory_xact_lock($1::bigint)", DISPATCH_LOCK_KEY)
        claim = asyncio.create_task(worker.claim(2))
        # It waits for the lock as its first statement, holding no row: the session row
        # it would lock next is free meanwhile.
        await poll_until(lambda: lock_waiters(pool), "the Claim waiting for the lock")
        async with pool.acquire() as other, other.transaction():
            await other.execute(
                "SELECT 1 FROM workers WHERE id = $1 FOR NO KEY UPDATE NOWAIT", worker.id
            )
        await transaction.commit()
        assert len(await asyncio.wait_for(claim, timeout=30)) == 2


async def test_a_claim_holding_rows_only_tries_the_dispatch_lock(pool: Pool) -> None:
    await start_run(pool, tasks(2))
    # An offer of another kind is left, so the Claim does not queue for the lock first;
    # when it reaches its grant, a pass holds the lock: it answers at once, empty.
    await start_run(pool, validate(WorkflowSpec("other", 1, (TaskSpec("g", "python", "noop"),))))
    await register(pool, kinds=("python",), max_concurrency=1, grants=False)
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    worker = await register(pool, max_concurrency=2)
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock($1::bigint)", DISPATCH_LOCK_KEY)
        assert await asyncio.wait_for(worker.claim(2), timeout=30) == []
    assert len(await worker.claim(2)) == 2


async def lock_waiters(pool: Pool) -> bool:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return count == 1


async def test_a_claim_grants_only_its_own_kinds(pool: Pool) -> None:
    await start_run(pool, tasks(2))
    other = await register(pool, kinds=("python",), max_concurrency=4)
    assert await other.claim(4) == []
    assert await pool.fetchval("SELECT count(*) FROM dispatches") == 0
    # The coordinator's pass still grants them (for the mock worker that comes later).
    await register(pool, max_concurrency=4)
    async with pool.acquire() as conn:
        assert (await dispatching.create_dispatches(conn)).created == 2
