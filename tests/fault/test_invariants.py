"""The invariant checker has teeth: a clean run passes, each kind of corruption is named.

A checker that never fails proves nothing, so every check is shown failing here on a
run driven through the storage layer (no processes: this is fast and not `fault`).
"""

from __future__ import annotations

from uuid import UUID

import pytest
from invariants import Expect, InvariantViolation, check_invariants

from awp_db import coordination, dispatching, leases, workers
from awp_db.connect import Pool
from support import spec, start_run

TTL_MS = 60_000


async def _register(pool: Pool) -> workers.Registration:
    return await workers.register(pool, "checker", 1, ["mock"], 10, {}, heartbeat_interval_ms=5_000)


async def _claim_all(pool: Pool, worker: workers.Registration) -> list[leases.IssuedLease]:
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
        return await leases.claim(conn, str(worker.worker_id), worker.session_token, 10, TTL_MS)


async def _complete(
    pool: Pool, worker: workers.Registration, issued: list[leases.IssuedLease]
) -> None:
    results = [
        leases.ResultIn(lease.dispatch_id, lease.lease_token, "succeeded", output={"n": 1})
        for lease in issued
    ]
    async with pool.acquire() as conn:
        verdicts = await leases.complete(conn, str(worker.worker_id), worker.session_token, results)
    assert all(v.value == "accepted" for v in verdicts), verdicts


async def _finished_run(pool: Pool, tasks: int = 2) -> tuple[UUID, workers.Registration]:
    run_id = await start_run(pool, spec(tasks=tasks))
    worker = await _register(pool)
    await _complete(pool, worker, await _claim_all(pool, worker))
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
    worker = await _register(pool)
    (first,) = await _claim_all(pool, worker)
    # Attempt 1's lease runs out and is reaped; attempt 2 then succeeds.
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE id = $1",
        first.dispatch_id,
    )
    async with pool.acquire() as conn:
        assert (await coordination.reap_expired(conn)).interrupted == 1
        await coordination.release_retries(conn)
    await _complete(pool, worker, await _claim_all(pool, worker))
    costs = await check_invariants(pool, {run_id: Expect()})
    assert costs[run_id].extra_executions == 1

    # Now pretend attempt 1's result was accepted too, after attempt 2 had started.
    await pool.execute(
        """
        UPDATE attempts SET state = 'succeeded', output = '{"n": 1}'::jsonb
         WHERE dispatch_id = $1
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
    assert "result written after a later attempt had started" in found


async def test_a_lease_left_with_an_offline_worker_is_found(pool: Pool) -> None:
    run_id = await start_run(pool, spec(tasks=1))
    worker = await _register(pool)
    await _claim_all(pool, worker)
    await pool.execute(
        "UPDATE workers SET state = 'offline', stopped_at = now() WHERE id = $1", worker.worker_id
    )
    found = await _violations(pool, {run_id: Expect("running", "running")})
    assert "still leased to offline worker checker" in found
    assert "task t0 is not terminal: running" in found
