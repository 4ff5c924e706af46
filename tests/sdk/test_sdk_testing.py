"""awp_sdk.testing: an action unit-tested without a server gets the context a worker
would hand it, its output checked as a worker checks it, cancel as a revoked lease."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import threading
from pathlib import Path
from typing import Any

import pytest

import awp_worker._attempt
from awp_sdk import ActionCancelled, ActionContext, RetryableError
from awp_sdk import testing as sdk_testing
from awp_sdk.actions import OutputError
from awp_sdk.testing import ActionEnvironment


def _context_keywords(module: Any) -> set[str]:
    """The keywords of the module's ActionContext(...) call."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ActionContext"
    ]
    assert len(calls) == 1, f"{module.__name__} builds ActionContext {len(calls)} times"
    return {keyword.arg for keyword in calls[0].keywords if keyword.arg}


def test_the_double_builds_the_workers_context_with_every_field() -> None:
    """The context is the class the worker hands an action, built with every field the
    worker sets: a field added to ActionContext or to the worker's lease fails here
    until the environment sets it too."""
    assert awp_worker._attempt.ActionContext is ActionContext
    assert type(ActionEnvironment().context()) is ActionContext
    public = {f.name for f in dataclasses.fields(ActionContext) if not f.name.startswith("_")}
    assert _context_keywords(awp_worker._attempt) == public
    assert _context_keywords(sdk_testing) == public


def greet(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    ctx.logger.info("greeting %s", ctx.run_input["name"])
    return {
        "greeting": f"hello, {ctx.run_input['name']}",
        "pair": (1, 2),
        "seen": input,
        "key": ctx.idempotency_key,
        "upstream": ctx.upstream_states,
        "left": ctx.time_remaining() > 0,
    }


def test_a_sync_action_runs_and_its_output_reads_as_downstream_reads_it() -> None:
    env = ActionEnvironment(run_input={"name": "Ada"}, upstream={"fetch": {"n": 2}})
    output = env.run(greet, {"big": 2**50, "tuple": (3,)})
    assert output == {
        "greeting": "hello, Ada",
        "pair": [1, 2],  # JSON has lists
        "seen": {"big": 2**50, "tuple": [3]},
        "key": "run-test/task",
        "upstream": {"fetch": "succeeded"},
        "left": True,
    }
    assert type(output["seen"]["big"]) is int
    assert env.logs == ["greeting Ada"]


async def shout(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    if ctx.attempt == 1:
        raise RetryableError("the first attempt fails")
    await asyncio.sleep(0)
    return {"attempt": ctx.attempt}


def test_an_async_action_and_its_errors() -> None:
    with pytest.raises(RetryableError, match="the first attempt fails"):
        ActionEnvironment().run(shout)
    assert ActionEnvironment(attempt=2).run(shout) == {"attempt": 2}


def test_what_a_worker_would_refuse_to_report_is_refused() -> None:
    env = ActionEnvironment()
    with pytest.raises(OutputError, match="returned list, expected a JSON object"):
        env.run(lambda ctx, input: [1])
    with pytest.raises(OutputError, match="outside"):
        env.run(lambda ctx, input: {"n": 2**53 + 1})
    with pytest.raises(ValueError, match=r"run_input\.n"):
        ActionEnvironment(run_input={"n": 2**53 + 1})


def test_cancel_reaches_a_sync_action_in_its_thread() -> None:
    env = ActionEnvironment()
    started = threading.Event()

    def patient(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        started.set()
        assert ctx.wait_cancelled(timeout=60)
        ctx.raise_if_cancelled()
        return {}

    def cancel_once_started() -> None:
        assert started.wait(60)
        env.cancel()

    threading.Thread(target=cancel_once_started).start()
    with pytest.raises(ActionCancelled):
        env.run(patient)


async def test_cancel_stops_an_async_action_as_a_revoked_lease_does() -> None:
    env = ActionEnvironment()
    started = asyncio.Event()

    async def forever(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {}

    running = asyncio.create_task(env.run_async(forever))
    async with asyncio.timeout(60):
        await started.wait()
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


async def test_the_deadline_ends_an_async_action() -> None:
    async def slow(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    with pytest.raises(TimeoutError):
        await ActionEnvironment(timeout=0.05).run_async(slow)
