"""A run's trace in storage (migration 0018, docs/observability.md): StartRun's trace
stored with the run and carried by its leases, the finished run's span taken for export
exactly once, the attempts the coordinator ended found for their rescue spans; and the
trace invariant of the checker has teeth."""

from __future__ import annotations

from uuid import UUID

import pytest

from awp_common.tracing import RunTrace, TraceRef
from awp_db import coordination, runs, traces, workflows
from awp_db.connect import Pool
from kit import spec
from kit.db import register
from kit.invariants import InvariantViolation, check_committed

CALLER = TraceRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
RUN_SPAN = "b7ad6b7169203331"


async def _traced_run(pool: Pool, tasks: int = 1) -> UUID:
    stored, _ = await workflows.create(pool, spec(tasks=tasks))
    trace = RunTrace(TraceRef(CALLER.trace_id, RUN_SPAN), CALLER.span_id)
    async with pool.acquire() as conn:
        started = await runs.start(conn, stored, {}, None, "test", start=runs.Start(trace=trace))
    return started.run_id


async def test_the_run_keeps_the_callers_trace_and_its_leases_carry_the_runs_span(
    pool: Pool,
) -> None:
    run_id = await _traced_run(pool)
    assert (await runs.get(pool, run_id)).trace_id == CALLER.trace_id
    worker = await register(pool, name="tracer")
    (lease,) = await worker.dispatch_and_claim()
    assert lease.trace == TraceRef(CALLER.trace_id, RUN_SPAN)
    assert lease.ready_at is not None and lease.ready_at <= lease.leased_at


async def test_an_untraced_run_has_no_trace(pool: Pool) -> None:
    stored, _ = await workflows.create(pool, spec())
    async with pool.acquire() as conn:
        started = await runs.start(conn, stored, {}, None, "test")
    assert (await runs.get(pool, started.run_id)).trace_id is None
    worker = await register(pool, name="tracer")
    (lease,) = await worker.dispatch_and_claim()
    assert lease.trace is None


async def test_a_finished_runs_span_is_taken_once_and_not_before_it_finishes(
    pool: Pool,
) -> None:
    run_id = await _traced_run(pool)
    async with pool.acquire() as conn:
        assert await traces.finished_runs(conn, 10) == []
    worker = await register(pool, name="tracer")
    issued = await worker.dispatch_and_claim()
    assert await worker.complete_all(issued) == ["ACCEPTED"]
    async with pool.acquire() as conn:
        (run,) = await traces.finished_runs(conn, 10)
        assert await traces.finished_runs(conn, 10) == []
    assert (run.id, run.state, run.trace_span, run.trace_parent) == (
        run_id,
        "succeeded",
        RUN_SPAN,
        CALLER.span_id,
    )
    await check_committed(pool)


async def test_an_expired_lease_is_found_for_its_rescue_span(pool: Pool) -> None:
    run_id = await _traced_run(pool)
    worker = await register(pool, name="tracer")
    (lease,) = await worker.dispatch_and_claim()
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        lease.dispatch_id,
    )
    async with pool.acquire() as conn:
        reaped = await coordination.reap_expired(conn)
        assert reaped.dispatch_ids == (lease.dispatch_id,)
        (ended,) = await traces.ended_attempts(conn, reaped.dispatch_ids)
    assert (ended.run_id, ended.attempt, ended.state) == (run_id, 1, "interrupted")
    assert ended.fencing_token == lease.fencing_token
    assert ended.trace_span == RUN_SPAN


async def test_a_span_exported_before_its_run_finished_is_found(pool: Pool) -> None:
    run_id = await _traced_run(pool)
    await check_committed(pool)
    await pool.execute("UPDATE runs SET trace_pending = false WHERE id = $1", run_id)
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    assert f"run {run_id}: its span was exported while it was still running" in str(caught.value)
