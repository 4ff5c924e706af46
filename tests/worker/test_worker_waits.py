"""ctx.sleep, ctx.wait_for_signal and ctx.wait_for_approval against the real server,
coordinator and PostgreSQL (docs/design.md §16): an attempt that reaches a wait not yet
satisfied ends SUSPENDED, holding no lease and no slot and charged nothing; the signal,
the decision or the timer makes the task ready, and the next attempt replays its steps
and the satisfied waits in order; a timeout raises WaitTimedOut inside the action."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from uuid import UUID

from test_worker_integration import run_state, server, start_worker, worker_config

from awp_coordinator.coordinator import Coordinator
from awp_db import runs, waits, workflows
from awp_db.connect import Pool
from awp_kernel.definition_proto import spec_from_proto
from awp_protocol.results import Replayed
from awp_sdk import Workflow
from awp_sdk.actions import ActionRegistry
from awp_sdk.waits import Decision, WaitTimedOut
from awp_worker import ActionContext
from awp_worker._executors import PythonExecutor
from awp_worker._lifecycle import EXIT_OK
from kit import ServerHandle, poll_until, spec, start_run
from kit.db import register
from kit.invariants import check_committed

__all__ = ["server"]  # a fixture

ran: list[str] = []


def work(label: str) -> str:
    ran.append(label)
    return label.upper()


async def waiting(pool: Pool, run_id: UUID, count: int) -> None:
    """Until `count` tasks of the run are WAITING."""

    async def probe() -> bool | None:
        n = await pool.fetchval(
            "SELECT count(*) FROM tasks WHERE run_id = $1 AND state = 'waiting'", run_id
        )
        return True if n == count else None

    await poll_until(probe, within=30)


async def test_a_signal_resumes_sync_and_async_actions_replaying_their_steps(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    ran.clear()
    registry = ActionRegistry()

    @registry.action("sync")
    def sync_agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        before = ctx.step("before", work, f"{ctx.task_key}:before")
        payload = ctx.wait_for_signal("go")
        after = ctx.step("after", work, f"{ctx.task_key}:after")
        return {"got": payload, "steps": [before, after]}

    @registry.action("async")
    async def async_agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        before = await ctx.step("before", work, f"{ctx.task_key}:before")
        await ctx.sleep(0)  # no time left: satisfied at once, no suspension
        payload = await ctx.wait_for_signal("go")
        after = await ctx.step("after", work, f"{ctx.task_key}:after")
        return {"got": payload, "steps": [before, after]}

    # One attempt allowed: a suspended attempt is not charged.
    workflow = spec("waits", tasks=2, kind="python", max_attempts=1)
    first, second = workflow.tasks
    workflow = replace(
        workflow, tasks=(replace(first, action="sync"), replace(second, action="async"))
    )
    run_id = await start_run(pool, workflow)
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    await waiting(pool, run_id, 2)
    assert (await check_committed(pool))["leased"] == 0
    async with pool.acquire() as conn:
        for n in (1, 2):
            await waits.send_signal(conn, run_id, "go", f'{{"n": {n}}}', None, "test")
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    outputs = {
        row["key"]: row["output"]
        for row in await pool.fetch("SELECT key, output FROM tasks WHERE run_id = $1", run_id)
    }
    assert sorted(o["got"]["n"] for o in outputs.values()) == [1, 2]
    assert sorted(ran) == sorted(f"{t}:{s}" for t in ("t0", "t1") for s in ("before", "after"))
    attempts = await pool.fetch(
        "SELECT t.key, a.attempt, a.state FROM attempts a JOIN tasks t ON t.id = a.task_id"
        " WHERE t.run_id = $1 ORDER BY 1, 2",
        run_id,
    )
    assert [tuple(r) for r in attempts] == [
        ("t0", 1, "suspended"),
        ("t0", 2, "succeeded"),
        ("t1", 1, "suspended"),
        ("t1", 2, "succeeded"),
    ]
    await check_committed(pool, finished=True)


async def test_a_timeout_raises_inside_the_action_and_an_approval_returns_its_decision(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    registry = ActionRegistry()

    @registry.action("agent")
    async def agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        try:
            await ctx.wait_for_signal("never", timeout=0.2)
            timed_out = False
        except WaitTimedOut:
            timed_out = True
        await ctx.sleep(0.2)
        decision: Decision = await ctx.wait_for_approval("Ship it?")
        return {"timed_out": timed_out, "approved": decision.approved, "by": decision.decided_by}

    workflow = spec("approve", tasks=1, kind="python", max_attempts=1)
    workflow = replace(workflow, tasks=(replace(workflow.tasks[0], action="agent"),))
    run_id = await start_run(pool, workflow)
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )

    async def asks() -> bool | None:
        kind = await pool.fetchval(
            "SELECT wait_kind FROM tasks WHERE run_id = $1 AND state = 'waiting'", run_id
        )
        return True if kind == "approval" else None

    await poll_until(asks, within=30)
    async with pool.acquire() as conn:
        await waits.decide(conn, run_id, "t0", True, "alice", "ok", lambda role: None)
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    output = await pool.fetchval("SELECT output FROM tasks WHERE run_id = $1", run_id)
    assert output == {"timed_out": True, "approved": True, "by": "alice"}
    # Three suspensions (the timeout, the sleep, the approval), then the attempt that ended.
    assert await pool.fetchval("SELECT suspensions FROM tasks WHERE run_id = $1", run_id) == 3
    await check_committed(pool, finished=True)


async def test_1000_waiting_tasks_hold_no_lease_and_no_slot_while_a_1_slot_worker_serves_others(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    # 1,000 tasks suspended at a wait (through the storage layer, for speed: the
    # suspension is the same transaction an Await makes).
    waiting_run = await start_run(pool, spec("waiting", tasks=1000))
    holder = await register(pool, max_concurrency=1000, name="suspender")
    leases = await holder.dispatch_and_claim(1000)
    assert len(leases) == 1000
    async with pool.acquire() as conn:
        for lease in leases:
            awaited = await waits.await_wait(
                conn,
                holder.worker_id,
                lease.dispatch_id,
                lease.lease_token,
                waits.Wait("signal", "go", 0, None),
                Replayed(),
            )
            assert awaited.outcome is waits.AwaitOutcome.SUSPENDED
    await waiting(pool, waiting_run, 1000)
    assert (await check_committed(pool))["leased"] == 0
    # A 1-slot worker runs another run's tasks to the end meanwhile.
    other = await start_run(pool, spec("other", tasks=5, task_input={"sleep_ms": 10}))
    worker = start_worker(worker_config(server, concurrency=1))
    assert await run_state(pool, other, "succeeded", "failed") == "succeeded"
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM dispatches d JOIN tasks t ON t.id = d.task_id"
            " WHERE t.run_id = $1 AND d.state IN ('pending', 'leased')",
            waiting_run,
        )
        == 0
    )
    assert await worker.stop() == EXIT_OK
    await check_committed(pool)


async def test_wait_tasks_run_on_no_worker_between_worker_tasks(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    flow = Workflow("gated-flow", 1, registry=ActionRegistry())
    fetch = flow.add("fetch", action="noop", kind="mock")
    nap = flow.wait("nap", sleep=0.2, depends_on=[fetch])
    gate = flow.wait("gate", approval="Publish?", depends_on=[nap])
    flow.add("publish", action="noop", kind="mock", depends_on=[gate])
    stored, _ = await workflows.create(pool, spec_from_proto(flow.definition()))
    async with pool.acquire() as conn:
        run_id = (await runs.start(conn, stored, {}, None, "test")).run_id
    worker = start_worker(worker_config(server, concurrency=1))

    async def at_gate() -> bool | None:
        state = await pool.fetchval(
            "SELECT state FROM tasks WHERE run_id = $1 AND key = 'gate'", run_id
        )
        return True if state == "waiting" else None

    await poll_until(at_gate, within=30)
    async with pool.acquire() as conn:
        await waits.decide(conn, run_id, "gate", True, "bob", "", lambda role: None)
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    attempts = await pool.fetch(
        "SELECT t.key, t.attempts FROM tasks t WHERE t.run_id = $1 ORDER BY t.id", run_id
    )
    assert [tuple(r) for r in attempts] == [("fetch", 1), ("nap", 0), ("gate", 0), ("publish", 1)]
    await check_committed(pool, finished=True)
