"""The invariant checker has teeth: a clean run passes, each kind of corruption is named.

A checker that never fails proves nothing, so every check is shown failing here on a
run driven through the storage layer (no processes: this is fast and not `fault`).
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from awp_db import claims, coordination
from awp_db.connect import Pool, connect
from kit import poll_until, spec, start_run
from kit.db import DbWorker, register
from kit.invariants import (
    Expect,
    InvariantViolation,
    ScenarioHealth,
    check_committed,
    check_invariants,
)
from kit.invariants.health import INTERNAL_MARK, deadlocks


async def _complete(worker: DbWorker, issued: list[claims.IssuedLease]) -> None:
    verdicts = await worker.complete_all(issued)
    assert all(v == "ACCEPTED" for v in verdicts), verdicts


async def _finished_run(pool: Pool, tasks: int = 2) -> tuple[UUID, DbWorker]:
    run_id = await start_run(pool, spec(tasks=tasks))
    worker = await register(pool, name="checker")
    await _complete(worker, await worker.dispatch_and_claim())
    return run_id, worker


async def _violations(pool: Pool, expected: dict[UUID, Expect]) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_invariants(pool, expected)
    return str(caught.value)


async def test_a_clean_run_passes_and_reports_its_cost(pool: Pool) -> None:
    run_id, _ = await _finished_run(pool)
    costs = await check_invariants(pool, {run_id: Expect()})
    assert (costs[run_id].tasks, costs[run_id].executions, costs[run_id].extra_executions) == (
        2,
        2,
        0,
    )


async def test_unexpected_states_are_named(pool: Pool) -> None:
    run_id, _ = await _finished_run(pool)
    found = await _violations(pool, {run_id: Expect("canceled", {"t0": "canceled"}, "succeeded")})
    assert "is succeeded, expected canceled" in found
    assert "task t0 is succeeded, expected canceled" in found
    assert "task t1" not in found


async def test_a_gap_in_the_event_log_is_found(pool: Pool) -> None:
    run_id, _ = await _finished_run(pool)
    await pool.execute("DELETE FROM state_events WHERE run_id = $1 AND seq = 3", run_id)
    assert "event seqs are not 1.." in await _violations(pool, {run_id: Expect()})


async def test_a_revision_without_events_is_found(pool: Pool) -> None:
    run_id, _ = await _finished_run(pool)
    await pool.execute("UPDATE runs SET revision = revision + 1 WHERE id = $1", run_id)
    assert "revisions are not 1.." in await _violations(pool, {run_id: Expect()})


async def test_a_result_written_after_its_lease_is_found(pool: Pool) -> None:
    run_id, _ = await _finished_run(pool, tasks=1)
    await pool.execute(
        "UPDATE dispatches SET finished_at = lease_expires_at + interval '3 seconds'"
        " WHERE run_id = $1",
        run_id,
    )
    assert "after its lease" in await _violations(pool, {run_id: Expect()})


async def test_a_second_accepted_result_and_a_stale_one_are_found(pool: Pool) -> None:
    run_id = await start_run(pool, spec(tasks=1))
    worker = await register(pool, name="checker")
    (first,) = await worker.dispatch_and_claim()
    # Attempt 1's lease runs out and is reaped; attempt 2 then succeeds.
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE id = $1",
        first.dispatch_id,
    )
    async with pool.acquire() as conn:
        assert (await coordination.reap_expired(conn)).interrupted == 1
        await coordination.release_retries(conn)
    await _complete(worker, await worker.dispatch_and_claim())
    costs = await check_invariants(pool, {run_id: Expect()})
    assert costs[run_id].extra_executions == 1

    # Now pretend attempt 1's result was accepted too, after attempt 2 had started.
    await pool.execute(
        """
        UPDATE attempts SET state = 'succeeded' WHERE dispatch_id = $1
        """,
        first.dispatch_id,
    )
    await pool.execute(
        "UPDATE dispatches SET state = 'completed', result_hash = sha256('x'),"
        " finished_at = clock_timestamp() WHERE id = $1",
        first.dispatch_id,
    )
    found = await _violations(pool, {run_id: Expect()})
    assert "succeeded with 2 succeeded attempts" in found
    assert "2 attempts' results accepted" in found
    assert "result written after a later attempt had started" in found

    # And an output stored on a task that did not succeed.
    await pool.execute(
        """UPDATE tasks SET state = 'failed', output = '{"n": 1}'::jsonb WHERE run_id = $1""",
        run_id,
    )
    assert "is failed yet has an output" in await _violations(pool, {run_id: Expect()})


async def test_a_lease_left_with_an_offline_worker_is_found(pool: Pool) -> None:
    run_id = await start_run(pool, spec(tasks=1))
    worker = await register(pool, name="checker")
    await worker.dispatch_and_claim()
    await pool.execute(
        "UPDATE workers SET state = 'offline', stopped_at = now() WHERE id = $1", worker.worker_id
    )
    found = await _violations(pool, {run_id: Expect("running", "running")})
    assert "still leased to offline worker checker" in found
    assert "task t0 is not terminal: running" in found


async def test_committed_state_checks_have_teeth(pool: Pool) -> None:
    run_id = await start_run(pool, spec(tasks=2))
    worker = await register(pool, name="checker", max_concurrency=2)
    (lease,) = await worker.dispatch_and_claim(1)  # one task running, the other queued
    assert await check_committed(pool) == {"live": 2, "leased": 1}
    with pytest.raises(InvariantViolation, match="2 live dispatches over the limit 1"):
        await check_committed(pool, global_limit=1)
    with pytest.raises(InvariantViolation, match="1 runs still running"):
        await check_committed(pool, finished=True)
    await pool.execute(
        "UPDATE tasks SET state = 'ready' WHERE run_id = $1 AND key = $2", run_id, lease.task_key
    )
    with pytest.raises(InvariantViolation, match=r"ready: \(0, 1, 1\) != \(0, 0, 0\)"):
        await check_committed(pool)


async def _deadlock(database_dsn: str, run_id: UUID) -> None:
    """Two transactions that lock a run's two tasks crosswise: PostgreSQL aborts one."""
    first, second = await connect(database_dsn), await connect(database_dsn)
    try:
        low, high = [
            row["id"]
            for row in await first.fetch(
                "SELECT id FROM tasks WHERE run_id = $1 ORDER BY id", run_id
            )
        ]
        lock = "SELECT 1 FROM tasks WHERE id = $1 FOR NO KEY UPDATE"
        async with first.transaction(), second.transaction():
            await first.execute(lock, low)
            await second.execute(lock, high)
            outcomes = await asyncio.gather(
                first.execute(lock, high), second.execute(lock, low), return_exceptions=True
            )
        assert any(isinstance(o, asyncpg.DeadlockDetectedError) for o in outcomes), outcomes
    finally:
        # A backend reports its deadlock count by the time it exits.
        await first.close()
        await second.close()


async def test_a_deadlock_or_an_internal_answer_is_found(pool: Pool, database_dsn: str) -> None:
    run_id, _ = await _finished_run(pool)
    quiet = '{"level": "info", "msg": "worker registered"}'
    await check_invariants(pool, {run_id: Expect()}, health=ScenarioHealth(0, {"server": quiet}))

    await _deadlock(database_dsn, run_id)
    counted = await poll_until(
        lambda: deadlocks(pool), "PostgreSQL to count the deadlock", within=30
    )
    with pytest.raises(InvariantViolation) as caught:
        await check_invariants(
            pool, {run_id: Expect()}, health=ScenarioHealth(counted, {"server": quiet})
        )
    assert f"PostgreSQL detected {counted} deadlock(s)" in str(caught.value)

    internal = f'{{"level": "error", "msg": "{INTERNAL_MARK}", "exc": "DeadlockDetectedError"}}'
    with pytest.raises(InvariantViolation) as caught:
        await check_invariants(
            pool, {run_id: Expect()}, health=ScenarioHealth(0, {"server2": quiet + "\n" + internal})
        )
    assert "server2 answered INTERNAL" in str(caught.value)
    met = "coordinator pass failed: asyncpg.exceptions.DeadlockDetectedError: deadlock detected"
    with pytest.raises(InvariantViolation, match="coordinator met a deadlock"):
        await check_invariants(
            pool, {run_id: Expect()}, health=ScenarioHealth(0, {"coordinator": met})
        )
