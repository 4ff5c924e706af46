"""The grant rule (awp_db.grant) over real PostgreSQL: concurrency keys rendered from the
run input, held by the lease from grant until it ends however it ends, taken fairly
across keys, exact with concurrent dispatchers; and the flow invariants (kit.invariants
.flow) fire on a corrupted history."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest

from awp_db import coordination, dispatching, grant
from awp_db.connect import Pool
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.errors import AwpError
from kit import start_run
from kit.db import dispatch_all, register
from kit.invariants import InvariantViolation, check_committed


def keyed(tasks: int, *limits: tuple[str, int], name: str = "keyed") -> WorkflowSpec:
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
                for i in range(tasks)
            ),
        )
    )


async def held(pool: Pool) -> dict[str, int]:
    rows = await pool.fetch(
        """SELECT k.key, count(*) AS n
             FROM dispatches d CROSS JOIN LATERAL unnest(d.concurrency_keys) AS k (key)
            WHERE d.state IN ('pending', 'leased') GROUP BY k.key"""
    )
    return {row["key"]: row["n"] for row in rows}


async def test_keys_are_rendered_from_the_run_input_and_bound_each_key(pool: Pool) -> None:
    workflow = keyed(5, ("user:{input.user}", 2))
    ann = await start_run(pool, workflow, run_input={"user": "ann"})
    bob = await start_run(pool, workflow, run_input={"user": "bob"})
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 4
    assert await held(pool) == {"user:ann": 2, "user:bob": 2}
    # A second pass grants nothing more: both keys are full, free slots or not.
    assert await dispatch_all(pool) == 0
    keys = await pool.fetch(
        "SELECT run_id, concurrency_keys FROM tasks WHERE key = 't0' ORDER BY run_id"
    )
    assert {row["run_id"]: list(row["concurrency_keys"]) for row in keys} == {
        ann: ["user:ann"],
        bob: ["user:bob"],
    }
    await check_committed(pool)


async def test_a_named_limit_is_shared_across_workflows(pool: Pool) -> None:
    await start_run(pool, keyed(4, ("llm", 3), name="a"))
    await start_run(pool, keyed(4, ("llm", 3), name="b"))
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 3
    assert await held(pool) == {"llm": 3}


async def test_a_run_whose_input_cannot_render_a_key_is_refused(pool: Pool) -> None:
    with pytest.raises(AwpError) as caught:
        await start_run(pool, keyed(1, ("user:{input.user.id}", 2)), run_input={"user": {}})
    assert "task 't0'" in str(caught.value)
    assert "'user:{input.user.id}'" in str(caught.value)
    assert "{input.user.id} is not in the run's input" in str(caught.value)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 0


async def test_a_task_of_several_keys_needs_a_unit_of_each(pool: Pool) -> None:
    await start_run(pool, keyed(3, ("a", 3), ("b", 1)))
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 1
    assert await held(pool) == {"a": 1, "b": 1}


async def test_units_go_back_exactly_when_the_lease_ends_however_it_ends(pool: Pool) -> None:
    run_id = await start_run(pool, keyed(8, ("k", 2)))
    worker = await register(pool, max_concurrency=50)
    # Complete.
    issued = await worker.dispatch_and_claim()
    assert len(issued) == 2 and await held(pool) == {"k": 2}
    assert await worker.complete_all(issued[:1]) == ["ACCEPTED"]
    assert await held(pool) == {"k": 1}
    # Hand-back (a draining worker's last Drain).
    outcome = await worker.drain(issued[1:])
    assert outcome is not None
    assert await held(pool) == {}
    # Expiry: a new worker's leases expire, the reaper ends them.
    other = await register(pool, max_concurrency=50, name="other")
    issued = await other.dispatch_and_claim()
    assert len(issued) == 2
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = now() - interval '1 second'"
        " WHERE state = 'leased'"
    )
    async with pool.acquire() as conn:
        await coordination.reap_expired(conn, 100)
    assert await held(pool) == {}
    # Revocation: canceling the run revokes its leases.
    issued = await other.dispatch_and_claim()
    assert len(issued) == 2
    await pool.execute("UPDATE runs SET cancel_requested_at = now() WHERE id = $1", run_id)
    async with pool.acquire() as conn:
        await coordination.converge_cancels(conn, 100)
    assert await held(pool) == {}
    await check_committed(pool)


async def test_free_units_are_taken_round_robin_across_keys(pool: Pool) -> None:
    """Ten keys of max 2, a hundred tasks each in key order: one pass with room for 20
    grants 2 of every key, not 20 of the first keys' backlog."""
    for user in range(10):
        await start_run(pool, keyed(100, ("user:{input.user}", 2)), run_input={"user": user})
    await register(pool, max_concurrency=20)
    assert await dispatch_all(pool) == 20
    assert await held(pool) == {f"user:{user}": 2 for user in range(10)}


async def pending_runs(pool: Pool) -> list[UUID]:
    """The runs of the pending dispatches, in the order they were granted."""
    rows = await pool.fetch("SELECT run_id FROM dispatches WHERE state = 'pending' ORDER BY id")
    return [row["run_id"] for row in rows]


async def test_runs_granted_together_are_served_again_in_the_order_they_were_granted(
    pool: Pool,
) -> None:
    """Round-robin across runs goes by when each run was last granted. The runs of one
    grant are stamped in the order they were granted, so the next grant serves them in
    that order again. (Stamped row by row as the UPDATE met them, the same runs always
    looked older than the rest of their batch and went first every time: with slots
    refilled a few at a time, two keys of ten got twice the others' starts.)"""
    workflow = keyed(3, ("user:{input.user}", 1))
    first = await start_run(pool, workflow, run_input={"user": "a"})
    second = await start_run(pool, workflow, run_input={"user": "b"})
    # Only its priority puts the later run first in this grant.
    await pool.execute("UPDATE runs SET priority = 5 WHERE id = $1", second)
    worker = await register(pool, max_concurrency=2, grants=False)
    assert await dispatch_all(pool) == 2
    assert await pending_runs(pool) == [second, first]
    await worker.complete_all(await worker.claim())
    await pool.execute("UPDATE runs SET priority = 0 WHERE id = $1", second)
    assert await dispatch_all(pool) == 2
    assert await pending_runs(pool) == [second, first]


async def test_concurrent_dispatchers_never_over_admit(pool: Pool) -> None:
    """Eight dispatch passes at once (as many coordinators or servers would): the
    dispatch lock makes the count exact, so key k never has more than 2 live leases."""
    await start_run(pool, keyed(50, ("k", 2)))
    await register(pool, max_concurrency=100)

    async def one_pass() -> int:
        async with pool.acquire() as conn:
            return (await dispatching.create_dispatches(conn)).created

    created = await asyncio.gather(*(one_pass() for _ in range(8)))
    assert sum(created) == 2
    assert await held(pool) == {"k": 2}


def test_the_kind_budget_is_the_free_slots_plus_prefetch_less_pending() -> None:
    rows = [grant.KindCapacity("mock", 4, 10, 1), grant.KindCapacity("python", 0, 4, 9)]
    assert grant.kind_budget(rows, 0.5) == {"mock": 8}


# --- the invariants have teeth --------------------------------------------------------


async def _two_leases(pool: Pool) -> tuple[UUID, list[Any]]:
    run_id = await start_run(pool, keyed(4, ("k", 2)))
    worker = await register(pool, max_concurrency=50)
    issued = await worker.dispatch_and_claim()
    assert len(issued) == 2
    await check_committed(pool)
    return run_id, issued


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def test_a_third_live_lease_of_a_key_of_max_2_is_found(pool: Pool) -> None:
    await _two_leases(pool)
    # Bypass the grant: a third task of the key offered anyway.
    await pool.execute(
        """WITH moved AS (
               UPDATE tasks SET state = 'queued'
                WHERE id = (SELECT min(id) FROM tasks WHERE state = 'ready') RETURNING *)
           INSERT INTO dispatches (run_id, task_id, executor_kind, concurrency_keys,
                                   concurrency_max)
           SELECT run_id, id, executor_kind, concurrency_keys, concurrency_max FROM moved"""
    )
    assert "key 'k': 3 live leases hold it, over its max 2" in await _violations(pool)


async def test_an_attempt_history_over_a_key_s_max_is_found(pool: Pool) -> None:
    _, issued = await _two_leases(pool)
    # A third attempt of the key, ended now but started while the two ran.
    third = await pool.fetchval(
        """INSERT INTO dispatches (run_id, task_id, executor_kind, state, finished_at,
                                   concurrency_keys, concurrency_max)
           SELECT run_id, id, executor_kind, 'expired', clock_timestamp(),
                  concurrency_keys, concurrency_max
             FROM tasks WHERE state = 'ready' ORDER BY id LIMIT 1
           RETURNING id"""
    )
    await pool.execute(
        """INSERT INTO attempts (task_id, run_id, attempt, dispatch_id, worker_id,
                                 fencing_token, state, started_at, deadline, finished_at)
           SELECT d.task_id, d.run_id, 1, d.id, a.worker_id, 999999, 'interrupted',
                  clock_timestamp(), a.deadline, clock_timestamp() + interval '1 second'
             FROM dispatches d, attempts a WHERE d.id = $1 AND a.dispatch_id = $2""",
        third,
        issued[0].dispatch_id,
    )
    await pool.execute(
        "UPDATE tasks SET attempts = 1 WHERE id = (SELECT task_id FROM dispatches WHERE id = $1)",
        third,
    )
    assert "3 attempts holding it were running at" in await _violations(pool)


async def test_a_unit_held_by_a_lease_whose_task_ended_is_found(pool: Pool) -> None:
    _, issued = await _two_leases(pool)
    await pool.execute(
        "UPDATE tasks SET state = 'succeeded', finished_at = now()"
        " WHERE id = (SELECT task_id FROM dispatches WHERE id = $1)",
        issued[0].dispatch_id,
    )
    assert "still holds ['k'] but its task 't0' is succeeded: a unit leaked" in (
        await _violations(pool)
    )


async def test_a_lease_holding_other_keys_than_its_task_is_found(pool: Pool) -> None:
    _, issued = await _two_leases(pool)
    await pool.execute(
        "UPDATE dispatches SET concurrency_keys = '{}', concurrency_max = '{}' WHERE id = $1",
        issued[0].dispatch_id,
    )
    assert f"dispatch {issued[0].dispatch_id} holds [] (max []); its task declares ['k']" in (
        await _violations(pool)
    )
