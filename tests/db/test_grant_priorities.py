"""Priorities with aging in the grant rule (awp_db.grant) over real PostgreSQL: a run's
and a task's priority order the grant, a lower one that has waited (top - base) aging
steps goes first, and the priority invariants (kit.invariants.priorities) fire on a
corrupted history."""

from __future__ import annotations

from uuid import UUID

import pytest

from awp_db import grant, runs, workflows
from awp_db.connect import Pool
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_protocol.errors import FieldsInvalid
from kit.db import dispatch_all, register
from kit.invariants import InvariantViolation, check_committed


def tasks(count: int, name: str = "prio", priorities: dict[int, int] | None = None) -> WorkflowSpec:
    return validate(
        WorkflowSpec(
            name=name,
            version=1,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind="mock",
                    action="noop",
                    priority=(priorities or {}).get(i, 0),
                )
                for i in range(count)
            ),
        )
    )


async def start(pool: Pool, workflow: WorkflowSpec, priority: int) -> UUID:
    stored, _ = await workflows.create(pool, workflow)
    async with pool.acquire() as conn:
        started = await runs.start(
            conn, stored, {}, None, "test", start=runs.Start(priority=priority)
        )
    return started.run_id


async def granted(pool: Pool) -> list[tuple[UUID, str, int]]:
    rows = await pool.fetch(
        """SELECT d.run_id, t.key, d.priority FROM dispatches d JOIN tasks t ON t.id = d.task_id
            ORDER BY d.id"""
    )
    return [(row["run_id"], row["key"], row["priority"]) for row in rows]


async def test_a_higher_priority_run_goes_first(pool: Pool) -> None:
    low = await start(pool, tasks(3), 0)
    high = await start(pool, tasks(3), 5)
    await register(pool, max_concurrency=2)
    assert await dispatch_all(pool) == 2
    assert [(run, p) for run, _, p in await granted(pool)] == [(high, 5), (high, 5)]
    assert low != high
    await check_committed(pool)


async def test_a_task_s_priority_adds_to_its_run_s(pool: Pool) -> None:
    # Run priority 2 + task t2's 3 = 5 > the other run's 4.
    mixed = await start(pool, tasks(3, "mixed", {2: 3}), 2)
    await start(pool, tasks(3, "flat"), 4)
    await register(pool, max_concurrency=1)
    assert await dispatch_all(pool) == 1
    assert await granted(pool) == [(mixed, "t2", 5)]
    await check_committed(pool)


async def test_a_lower_priority_that_waited_its_steps_goes_first(pool: Pool) -> None:
    low = await start(pool, tasks(1, "low"), -5)
    await start(pool, tasks(3, "high"), 5)
    await register(pool, max_concurrency=1)
    # The low task has waited 10 aging steps (5 - -5): it ranks with the highest, ahead
    # of them (the clock moved on, not a shortcut around the rule's inputs).
    await pool.execute(
        "UPDATE tasks SET ready_at = ready_at - $2 * interval '1 millisecond' WHERE run_id = $1",
        low,
        10 * grant.AGING_STEP_MS + 100,
    )
    assert await dispatch_all(pool) == 1
    assert await granted(pool) == [(low, "t0", 5)]
    await check_committed(pool)


async def test_a_lower_priority_short_of_its_steps_still_waits(pool: Pool) -> None:
    low = await start(pool, tasks(1, "low"), -5)
    high = await start(pool, tasks(3, "high"), 5)
    await register(pool, max_concurrency=1)
    await pool.execute(
        "UPDATE tasks SET ready_at = ready_at - $2 * interval '1 millisecond' WHERE run_id = $1",
        low,
        8 * grant.AGING_STEP_MS + 100,
    )
    assert await dispatch_all(pool) == 1
    assert [(run, p) for run, _, p in await granted(pool)] == [(high, 5)]
    async with pool.acquire() as conn:
        why = (await grant.explain(conn, low))["t0"]
    assert why.startswith("waiting behind higher-priority work (priority 3 of -5 aged"), why


async def test_a_priority_out_of_range_is_refused_naming_the_task() -> None:
    with pytest.raises(FieldsInvalid) as caught:
        tasks(1, priorities={0: 11})
    assert "task 't0': must be -10 to 10" in str(caught.value)


# --- the invariants have teeth --------------------------------------------------------


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def test_a_lower_priority_granted_before_a_higher_in_one_pass_is_found(pool: Pool) -> None:
    await start(pool, tasks(2, "a"), 3)
    await register(pool, max_concurrency=2)
    assert await dispatch_all(pool) == 2
    await check_committed(pool)
    await pool.execute(
        "UPDATE dispatches SET priority = 2 WHERE id = (SELECT min(id) FROM dispatches)"
    )
    found = await _violations(pool)
    assert "granted after dispatch" in found and "higher must go first" in found
    assert "outside its task's base 3" in found
