"""Failure policies and always tasks against real PostgreSQL, driven through the storage
calls workers and the coordinator make: a failure that fails the run (the default) and
one that lets independent branches continue; always tasks after a success, after a
failure and on cancel; the run's final state."""

from __future__ import annotations

from coordinator_support import coordinator, pass_until
from test_coordinator_maps import answers, drive, task, workflow

from awp_db import runs
from awp_db.connect import Pool
from awp_kernel.definition import MapSpec, TaskSpec
from kit import start_run
from kit.db import converge_cancel, register, run_state, task_states
from kit.invariants import Expect, check_committed, check_invariants


def branches(policy: str) -> tuple[TaskSpec, ...]:
    """a -> b (policy) -> c -> d; a -> e -> f: two branches, the first one failing."""
    return (
        task("a"),
        task("b", ["a"], on_failure=policy),
        task("c", ["b"]),
        task("d", ["c"]),
        task("e", ["a"]),
        task("f", ["e"]),
    )


async def test_by_default_a_failure_fails_the_run_at_once(pool: Pool) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, workflow("fail", *branches("fail_run")))
    await drive(pool, worker, run_id, answers([]), fail=["b"])
    assert await task_states(pool, run_id) == {
        "a": "succeeded",
        "b": "failed",
        "c": "skipped",
        "d": "skipped",
        "e": "succeeded",  # claimed in the same round as b
        "f": "skipped",  # never started: the run failed first
    }
    assert await run_state(pool, run_id) == "failed"


async def test_continue_skips_only_the_downstream_and_the_run_ends_failed(pool: Pool) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, workflow("continue", *branches("continue")))
    (a,) = await worker.dispatch_and_claim()
    await worker.complete(a)
    b, e = await worker.dispatch_and_claim()
    assert await worker.complete(b, "failed", retryable=False) == "ACCEPTED"
    # c and d can never run; the other branch goes on, and so does the run.
    assert await task_states(pool, run_id) == {
        "a": "succeeded",
        "b": "failed",
        "c": "skipped",
        "d": "skipped",
        "e": "running",
        "f": "pending",
    }
    assert await run_state(pool, run_id) == "running"
    await worker.complete(e)
    (f,) = await worker.dispatch_and_claim()
    await worker.complete(f)
    # Nothing is left running: the run ends, failed (one of its tasks failed).
    assert await run_state(pool, run_id) == "failed"
    await check_invariants(
        pool,
        {
            run_id: Expect(
                "failed",
                {"b": "failed", "c": "skipped", "d": "skipped"},
                default_task_state="succeeded",
            )
        },
    )


async def test_a_map_task_that_continues(pool: Pool) -> None:
    """One element failing for good fails the map task; its policy then lets the rest
    of the run go on."""
    flow = workflow(
        "map-continue",
        task("plan"),
        task("search", ["plan"], map=MapSpec("plan", "queries"), on_failure="continue"),
        task("summarize", ["search"]),
        task("other", ["plan"]),
    )
    worker = await register(pool)
    run_id = await start_run(pool, flow)
    await drive(pool, worker, run_id, answers(["a", "b", "c"]), fail=["search[1]"], claim=1)
    states = await task_states(pool, run_id)
    assert states["search"] == "failed" and states["summarize"] == "skipped"
    assert states["other"] == "succeeded" and states["search[1]"] == "failed"
    assert await run_state(pool, run_id) == "failed"
    await check_committed(pool, finished=True)


async def test_always_tasks_run_after_a_success_in_their_order(pool: Pool) -> None:
    flow = workflow(
        "always-ok",
        task("a"),
        task("b", ["a"]),
        task("cleanup", ["b"], always=True),
        task("notify", ["cleanup", "a"], always=True),
    )
    worker = await register(pool)
    run_id = await start_run(pool, flow)
    (a,) = await worker.dispatch_and_claim()
    await worker.complete(a)
    # a succeeded, but an always task waits for every other task to end.
    assert (await task_states(pool, run_id))["cleanup"] == "pending"
    (b,) = await worker.dispatch_and_claim()
    await worker.complete(b)
    (cleanup,) = await worker.dispatch_and_claim()
    assert cleanup.task_key == "cleanup"
    assert cleanup.upstream_states == {"b": "succeeded"}
    assert cleanup.upstream_outputs == {"b": {"task": "b", "attempt": 1}}
    assert (await task_states(pool, run_id))["notify"] == "pending"  # after cleanup
    # The always task's own failure is recorded; it does not stop the next one...
    assert await worker.complete(cleanup, "failed", retryable=False) == "ACCEPTED"
    (notify,) = await worker.dispatch_and_claim()
    assert notify.upstream_states == {"cleanup": "failed", "a": "succeeded"}
    assert notify.upstream_outputs["cleanup"] == {}
    await worker.complete(notify)
    # ...nor change the run's outcome, decided by the other tasks.
    assert await run_state(pool, run_id) == "succeeded"
    await check_invariants(
        pool,
        {run_id: Expect("succeeded", {"cleanup": "failed"}, default_task_state="succeeded")},
    )


async def test_an_always_task_runs_after_a_failure(pool: Pool) -> None:
    flow = workflow(
        "always-failed",
        task("a"),
        task("b", ["a"]),
        task("c"),
        task("cleanup", ["b"], always=True),
    )
    worker = await register(pool)
    run_id = await start_run(pool, flow)
    a, c = await worker.dispatch_and_claim()
    await worker.complete(a, "failed", retryable=False)
    # The run fails: c's lease is revoked and b skipped; the always task's turn has come.
    assert await task_states(pool, run_id) == {
        "a": "failed",
        "b": "skipped",
        "c": "canceled",
        "cleanup": "ready",
    }
    assert await run_state(pool, run_id) == "running"
    assert await worker.complete(c) == "LEASE_LOST"
    (cleanup,) = await worker.dispatch_and_claim()
    assert cleanup.upstream_states == {"b": "skipped"}
    await worker.complete(cleanup)
    assert await run_state(pool, run_id) == "failed"
    await check_invariants(
        pool,
        {
            run_id: Expect(
                "failed",
                {"a": "failed", "b": "skipped", "c": "canceled", "cleanup": "succeeded"},
            )
        },
    )


async def test_always_tasks_do_not_run_on_cancel(pool: Pool) -> None:
    flow = workflow("always-cancel", task("a"), task("cleanup", ["a"], always=True))
    worker = await register(pool)
    run_id = await start_run(pool, flow)
    (a,) = await worker.dispatch_and_claim()
    async with pool.acquire() as conn:
        await runs.request_cancel(conn, run_id, "stop", "test")
    await converge_cancel(pool, run_id)
    assert await task_states(pool, run_id) == {"a": "canceled", "cleanup": "canceled"}
    assert await run_state(pool, run_id) == "canceled"
    assert await worker.complete(a) == "LEASE_LOST"


async def test_a_cancel_while_an_always_task_runs_cancels_the_run(pool: Pool) -> None:
    """The rest had succeeded, but the run was stopped before it had ended."""
    coord = coordinator(pool)
    flow = workflow("cancel-cleanup", task("a"), task("cleanup", ["a"], always=True))
    worker = await register(pool)
    run_id = await start_run(pool, flow)
    (a,) = await worker.dispatch_and_claim()
    await worker.complete(a)
    (cleanup,) = await worker.dispatch_and_claim()
    async with pool.acquire() as conn:
        await runs.request_cancel(conn, run_id, "stop", "test")
    report = await coord.run_pass()
    assert report.canceled_runs == 1
    assert await task_states(pool, run_id) == {"a": "succeeded", "cleanup": "canceled"}
    assert await run_state(pool, run_id) == "canceled"
    assert await worker.complete(cleanup) == "LEASE_LOST"
    await check_committed(pool, finished=True)


async def test_the_sweep_releases_always_tasks_a_settlement_left_waiting(pool: Pool) -> None:
    """The coordinator's completion sweep finds a run whose only live tasks are always
    tasks waiting for their turn (settlement normally releases them itself)."""
    coord = coordinator(pool)
    flow = workflow("sweep", task("a"), task("cleanup", ["a"], always=True))
    worker = await register(pool)
    run_id = await start_run(pool, flow)
    # As if a transaction had ended `a` without looking at the always tasks.
    await pool.execute(
        """UPDATE tasks SET state = 'succeeded', output = '{}', finished_at = now()
            WHERE run_id = $1 AND key = 'a'""",
        run_id,
    )
    await pass_until(coord, lambda report: report.dispatched == 1)
    (cleanup,) = await worker.claim()
    assert cleanup.task_key == "cleanup"
    await worker.complete(cleanup)
    assert await run_state(pool, run_id) == "succeeded"
