"""The grant's plain path (grant.sql: candidates, migration 0023): with no priority, key,
rate limit or placement anywhere among the ready tasks and running runs, the grant reads
only the first runs in turn, and chooses exactly what reading every run would."""

from __future__ import annotations

from uuid import UUID

import pytest

from awp_db import dispatching, grant
from awp_db.connect import Pool
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from kit import spec, start_run
from kit.db import register


async def chosen(pool: Pool, budget: int) -> list[tuple[UUID, int]]:
    async with pool.acquire() as conn, conn.transaction():
        return [(g.run_id, g.task_id) for g in await grant.choose(conn, {"mock": budget}, None)]


async def plain(pool: Pool) -> bool:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE state = 'ready' AND priority <> 0)"
            " AND NOT EXISTS (SELECT 1 FROM runs WHERE state = 'running' AND priority <> 0)"
        )
        assert row is not None
        return bool(row[0])


async def shape_elsewhere(pool: Pool) -> None:
    """A ready task of another kind with a priority: it is no candidate of the mock
    grants below, but it rules the plain path out, so they read every run."""
    task = TaskSpec("shaped", "python", "noop", priority=3)
    await start_run(pool, validate(WorkflowSpec("elsewhere", 1, (task,))))


async def started(pool: Pool, runs: int, tasks: int, *, concurrency: int = 0) -> list[UUID]:
    workflow = spec(f"w{tasks}x{concurrency}", tasks, concurrency=concurrency)
    return [await start_run(pool, workflow) for _ in range(runs)]


@pytest.mark.parametrize("budget", [1, 6, 12, 40])
async def test_the_plain_path_chooses_what_reading_every_run_chooses(
    pool: Pool, budget: int
) -> None:
    # One pass grants a task of each of 11 runs: the first run's concurrency (1) is then
    # full, and it heads the round-robin of the dispatched runs; 4 runs never dispatched
    # go before it, and 6 more of three tasks after them.
    await register(pool, max_concurrency=11, name="small")
    full = await started(pool, 1, 3, concurrency=1)
    await started(pool, 10, 2)
    async with pool.acquire() as conn:
        assert (await dispatching.create_dispatches(conn)).created == 11
    await started(pool, 4, 1)
    await started(pool, 6, 3)
    assert await plain(pool)
    fast = await chosen(pool, budget)
    assert full[0] not in {run for run, _ in fast}
    await shape_elsewhere(pool)
    assert not await plain(pool)
    assert fast == await chosen(pool, budget)
    # Every candidate but the full run's: 10 + 4 + 18.
    assert len(fast) == min(budget, 32)


async def test_a_prioritised_task_in_the_last_run_in_turn_still_goes_first(pool: Pool) -> None:
    await register(pool, max_concurrency=200)
    await started(pool, 20, 1)
    urgent = TaskSpec("urgent", "mock", "noop", priority=5)
    last = await start_run(pool, validate(WorkflowSpec("urgent", 1, (urgent,))))
    (first, *_) = await chosen(pool, 3)
    assert first[0] == last
