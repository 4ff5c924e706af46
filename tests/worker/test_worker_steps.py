"""ctx.step against the real server and PostgreSQL: a retried attempt replays the memos
of the steps an earlier one finished and runs only the rest, for sync and async actions
alike, and the task shows what the memos saved; a step finished after the lease was
lost stores nothing and stops the attempt (docs/design.md §16)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from test_worker_integration import run_state, server, start_worker, worker_config

from awp_coordinator.coordinator import Coordinator
from awp_db.connect import Pool
from awp_protocol.limits import MAX_MEMOS_PER_TASK
from awp_sdk.actions import ActionCancelled, ActionRegistry, RetryableError
from awp_sdk.steps import step
from awp_worker import ActionContext
from awp_worker._executors import PythonExecutor
from awp_worker._lifecycle import EXIT_OK
from kit import ServerHandle, poll_until, spec, start_run
from kit.invariants import check_committed

__all__ = ["server"]  # a fixture

ran: list[str] = []


def model(task: str, prompt: str) -> dict[str, Any]:
    ran.append(f"{task}:{prompt}")
    return {"text": prompt.upper(), "tokens": 100 * len(prompt)}


@step("summarise", usage=lambda r: {"tokens": r["tokens"], "cost_usd": 0.01})
async def summarise(task: str, prompt: str) -> dict[str, Any]:
    return model(task, prompt)


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": result["tokens"], "cost_usd": 0.01}


async def memos(pool: Pool, run_id: object) -> list[tuple[str, str, int, int]]:
    rows = await pool.fetch(
        """SELECT t.key, c.name, c.occurrence, c.attempt FROM checkpoints c
             JOIN tasks t ON t.id = c.task_id WHERE c.run_id = $1
            ORDER BY t.key, c.name, c.occurrence""",
        run_id,
    )
    return [tuple(row) for row in rows]  # type: ignore[misc]


async def test_a_retry_runs_only_the_steps_no_attempt_finished(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    ran.clear()
    registry = ActionRegistry()

    @registry.action("sync")
    def sync_agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        a = ctx.step("call", model, ctx.task_key, "ab", usage=_usage)
        b = ctx.step("call", model, ctx.task_key, "cde", usage=_usage)
        if ctx.attempt == 1:
            raise RetryableError("crashed after two of three steps")
        c = ctx.step("final", model, ctx.task_key, "f", usage=_usage)
        return {"texts": [a["text"], b["text"], c["text"]]}

    @registry.action("async")
    async def async_agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        a = await ctx.step("call", model, ctx.task_key, "ab", usage=_usage)
        b = await summarise(ctx.task_key, "cde")
        if ctx.attempt == 1:
            raise RetryableError("crashed after two of three steps")
        c = await ctx.step("final", model, ctx.task_key, "f", usage=_usage)
        return {"texts": [a["text"], b["text"], c["text"]]}

    workflow = spec("steps", tasks=2, kind="python", max_attempts=2)
    first, second = workflow.tasks
    workflow = replace(
        workflow, tasks=(replace(first, action="sync"), replace(second, action="async"))
    )
    run_id = await start_run(pool, workflow)
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    for task in ("t0", "t1"):
        assert [r for r in ran if r.startswith(task)] == [
            f"{task}:ab",
            f"{task}:cde",
            f"{task}:f",
        ], "each step ran once across the two attempts"
    assert await memos(pool, run_id) == [
        ("t0", "call", 0, 1),
        ("t0", "call", 1, 1),
        ("t0", "final", 0, 2),
        ("t1", "call", 0, 1),
        ("t1", "final", 0, 2),
        ("t1", "summarise", 0, 1),
    ]
    saved = await pool.fetch(
        "SELECT key, saved_steps, saved_tokens, saved_cost_usd FROM tasks "
        "WHERE run_id = $1 ORDER BY key",
        run_id,
    )
    assert [(r["key"], r["saved_steps"], r["saved_tokens"]) for r in saved] == [
        ("t0", 2, 500),
        ("t1", 2, 500),
    ]
    assert all(abs(r["saved_cost_usd"] - 0.02) < 1e-9 for r in saved)
    await check_committed(pool)


async def test_a_step_finished_after_the_lease_was_lost_stores_nothing(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    registry = ActionRegistry()
    inside = threading.Event()
    go_on = threading.Event()
    outcome: list[str] = []

    def slow(attempt: int) -> int:
        if attempt == 1:
            inside.set()
            go_on.wait(30)
        return attempt

    @registry.action("noop")
    def agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        try:
            value = ctx.step("slow", slow, ctx.attempt)
        except ActionCancelled:
            outcome.append("cancelled")
            raise
        outcome.append(f"stored {value}")
        return {"value": value}

    run_id = await start_run(pool, spec("lost", tasks=1, kind="python", max_attempts=2))
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    await poll_until(inside.is_set, what="the first attempt inside its step")
    # The lease ends on the database clock (as a revocation would) while the step runs.
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE state = 'leased'"
    )
    go_on.set()
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    await poll_until(lambda: len(outcome) == 2, what="both attempts done")
    assert outcome == ["cancelled", "stored 2"]
    assert await worker.stop() == EXIT_OK
    assert await memos(pool, run_id) == [("t0", "slow", 0, 2)]
    output = await pool.fetchval("SELECT output FROM tasks WHERE run_id = $1", run_id)
    assert output == {"value": 2}
    await check_committed(pool)


async def test_a_step_past_the_tasks_memo_limit_fails_the_task_naming_it(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    registry = ActionRegistry()

    @registry.action("noop")
    def agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"value": ctx.step("one-more", lambda: 1)}

    run_id = await start_run(pool, spec("full", tasks=1, kind="python", max_attempts=3))
    # The task holds as many checkpoints as a task may (made directly: satisfied sleeps).
    await pool.execute(
        """INSERT INTO checkpoints (task_id, run_id, kind, name, occurrence, value, value_bytes)
           SELECT t.id, t.run_id, 'sleep', '', n, '{}', 2
             FROM tasks t, generate_series(0, $2 - 1) AS n WHERE t.run_id = $1""",
        run_id,
        MAX_MEMOS_PER_TASK,
    )
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    assert await run_state(pool, run_id, "succeeded", "failed") == "failed"
    assert await worker.stop() == EXIT_OK
    task = await pool.fetchrow("SELECT attempts, error FROM tasks WHERE run_id = $1", run_id)
    assert task is not None and task["attempts"] == 1, "a memo limit is not retried"
    assert "MEMO_LIMIT" in task["error"]["message"]
    assert "memos-per-task limit" in task["error"]["message"]
    assert not task["error"]["retryable"]
