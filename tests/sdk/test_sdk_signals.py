"""Signals and decisions through the SDK's clients against a real stack (server,
coordinator, worker): RunHandle.signal before the wait is reached is kept and delivered,
a repeated request id sends nothing more, a finished run refuses one (RunFinished);
approve resumes an action's approval and decisions() reads it back; a decision on a task
that waits for nothing is NotWaiting. The sync Client does the same from plain code."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sdk_stack import Stack

from awp_sdk import ActionContext, Client, NotWaiting, RunFinished, TaskState, Workflow
from kit import ADMIN_TOKEN, poll_until

signalled = Workflow("sdk-signalled", version=1)


@signalled.task(timeout="30s")
async def receive(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    first = await ctx.wait_for_signal("go")
    second = await ctx.wait_for_signal("go")
    return {"payloads": [first, second]}


approved = Workflow("sdk-approved", version=1)


@approved.task(timeout="30s")
def decide(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    decision = ctx.wait_for_approval("Go ahead?")
    return {"approved": decision.approved, "by": decision.decided_by, "why": decision.comment}


async def test_signals_from_a_run_handle_are_kept_delivered_in_order_and_once(
    stack: Stack,
) -> None:
    async with stack.client() as client:
        await client.apply(signalled)
        run = await client.start(signalled)
        # Sent before the action reaches its waits (or while it waits): none is lost.
        first = await run.signal("go", {"n": 2**40}, request_id="first")
        again = await run.signal("go", {"n": -1}, request_id="first")
        assert again.duplicate and again.signal_id == first.signal_id
        await run.signal("go", ["second", None])
        outputs = await run.result(timeout=60)
        assert outputs["receive"]["payloads"] == [{"n": 2**40}, ["second", None]]
        with pytest.raises(RunFinished, match="has ended"):
            await run.signal("go", 1)


async def test_an_approval_through_the_client_resumes_the_action_and_is_read_back(
    stack: Stack,
) -> None:
    async with stack.client() as client:
        await client.apply(approved)
        run = await client.start(approved)

        async def waiting() -> bool:
            task = (await run.get(outputs=False)).tasks["decide"]
            return task.state is TaskState.WAITING

        await poll_until(waiting, "the task to wait for its approval", within=60)
        task = (await run.get(outputs=False)).tasks["decide"]
        assert task.wait is not None and task.wait.prompt == "Go ahead?"
        assert (task.suspensions, task.charged_attempts) == (1, 0)

        def approve_from_plain_code() -> None:
            with Client(stack.address, token=ADMIN_TOKEN) as sync:
                decided = sync.approve(run.id, "decide", comment="fine by me")
                assert (decided.task_state, decided.resumed_attempt) == (TaskState.READY, 1)
                with pytest.raises(NotWaiting):
                    sync.reject(run.id, "decide")

        await asyncio.to_thread(approve_from_plain_code)
        outputs = await run.result(timeout=60)
        assert outputs["decide"] == {"approved": True, "by": "admin", "why": "fine by me"}
        (decision,) = await client.decisions(run.id)
        assert (decision.task_key, decision.approved, decision.decided_by) == (
            "decide",
            True,
            "admin",
        )
        assert (decision.comment, decision.resumed_attempt) == ("fine by me", 1)
        assert decision.decided_at is not None
