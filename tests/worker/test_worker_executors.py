"""Executors (mock, python), the SDK, and output/input conversion."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import zlib
from typing import Any

import pytest
from google.protobuf import struct_pb2

from awp.v1 import worker_pb2
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.limits import MAX_ERROR_MESSAGE_CHARS, MAX_OUTPUT_BYTES
from awp_sdk.actions import DEFAULT_REGISTRY, ActionRegistry, OutputError, output_struct
from awp_worker import ActionCancelled, ActionContext, PermanentError, RetryableError, action
from awp_worker._executors import (
    MockExecutor,
    PythonExecutor,
    failure_from_exception,
)
from awp_worker._logging import bind, bound_fields, unbind


def make_ctx(action: str = "a", attempt: int = 1) -> ActionContext:
    return ActionContext(
        run_id="r",
        task_key="t",
        action=action,
        attempt=attempt,
        max_attempts=3,
        idempotency_key="r/t",
        fencing_token=7,
        deadline=time.monotonic() + 60,
    )


def make_lease(dispatch_id: int = 1) -> worker_pb2.Lease:
    return worker_pb2.Lease(dispatch_id=dispatch_id, lease_token=f"tok-{dispatch_id}")


# --- mock -----------------------------------------------------------------------------


async def test_mock_echoes_its_input_deterministically() -> None:
    mock = MockExecutor()
    out = await mock.execute(make_ctx("say", attempt=2), {"x": [1, {"y": None}]})
    assert out == {"action": "say", "echo": {"x": [1, {"y": None}]}, "attempt": 2}
    assert out == await mock.execute(make_ctx("say", attempt=2), {"x": [1, {"y": None}]})


async def test_mock_sleep_is_cancellable() -> None:
    task = asyncio.create_task(MockExecutor().execute(make_ctx(), {"sleep_ms": 60_000}))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_mock_fail_is_permanent() -> None:
    with pytest.raises(PermanentError, match=r"^boom$"):
        await MockExecutor().execute(make_ctx(), {"fail": "boom"})
    with pytest.raises(PermanentError, match="requested"):
        await MockExecutor().execute(make_ctx(), {"fail": True})
    assert await MockExecutor().execute(make_ctx(), {"fail": False})


async def test_mock_fail_attempts_is_retryable_until_the_attempt_passes_it() -> None:
    mock = MockExecutor()
    for attempt in (1, 2):
        with pytest.raises(RetryableError):
            await mock.execute(make_ctx(attempt=attempt), {"fail_attempts": 2})
    assert (await mock.execute(make_ctx(attempt=3), {"fail_attempts": 2}))["attempt"] == 3  # type: ignore[index]


async def test_mock_output_bytes_pads_the_output_up_to_the_output_limit() -> None:
    output = await MockExecutor().execute(make_ctx(), {"output_bytes": 100_001})
    again = await MockExecutor().execute(make_ctx(attempt=2), {"output_bytes": 100_001})
    padding = output["padding"]  # type: ignore[index]
    assert len(padding) == 100_001 and set(padding) <= set("0123456789abcdef")
    assert again["padding"] == padding  # type: ignore[index]
    # Not compressible away: zlib keeps most of it (hex digits: 4 bits each at best).
    assert len(zlib.compress(padding.encode())) > 45_000
    with pytest.raises(PermanentError, match=f"output_bytes must be at most {MAX_OUTPUT_BYTES}"):
        await MockExecutor().execute(make_ctx(), {"output_bytes": MAX_OUTPUT_BYTES + 1})


@pytest.mark.parametrize(
    "bad", [{"sleep_ms": "x"}, {"fail_attempts": True}, {"fail": 3}, {"output_bytes": "big"}]
)
async def test_mock_rejects_malformed_fields(bad: dict[str, Any]) -> None:
    with pytest.raises(PermanentError, match="mock"):
        await MockExecutor().execute(make_ctx(), bad)


# --- conversion -----------------------------------------------------------------------


def test_struct_input_gives_whole_numbers_back_as_ints() -> None:
    struct = struct_pb2.Struct()
    struct.update({"n": 3, "f": 2.5, "l": [1, 2.0, "s", True, None], "d": {"big": 1e300}})
    assert struct_to_dict(struct) == {
        "n": 3,
        "f": 2.5,
        "l": [1, 2, "s", True, None],
        "d": {"big": 1e300},
    }
    assert isinstance(struct_to_dict(struct)["n"], int)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([1, 2], "returned list, expected a JSON object"),
        (None, "returned NoneType"),
        ({"when": object()}, "not valid JSON"),
        ({"x": math.nan}, "not valid JSON"),
        ({"blob": "x" * (1024 * 1024 + 1)}, "more than the 1048576 allowed"),
    ],
)
def test_bad_outputs_are_permanent_failures_naming_the_problem(value: object, problem: str) -> None:
    with pytest.raises(OutputError, match=problem):
        output_struct(value)
    assert issubclass(OutputError, PermanentError)


def test_outputs_convert_like_json() -> None:
    struct = output_struct({1: "a", "nested": {"t": (1, 2)}})
    assert struct_to_dict(struct) == {"1": "a", "nested": {"t": [1, 2]}}


def test_exceptions_map_to_failures() -> None:
    lease = make_lease()
    permanent = failure_from_exception(lease, PermanentError("no"))
    assert (permanent.error.message, permanent.error.retryable) == ("no", False)
    retry = failure_from_exception(lease, RetryableError("later"))
    assert (retry.error.message, retry.error.retryable) == ("later", True)
    other = failure_from_exception(lease, KeyError("k"))
    assert (other.error.message, other.error.retryable) == ("KeyError: 'k'", True)
    assert other.outcome == worker_pb2.RESULT_OUTCOME_FAILED
    assert (other.dispatch_id, other.lease_token) == (1, "tok-1")
    long = failure_from_exception(lease, ValueError("x" * 50_000))
    assert len(long.error.message) == MAX_ERROR_MESSAGE_CHARS
    assert long.error.message.endswith("[truncated]")


# --- SDK ------------------------------------------------------------------------------


def test_actions_register_by_name() -> None:
    registry = ActionRegistry()

    @action("reports.summarize", registry=registry)
    def summarize(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {}

    found = registry.get("reports.summarize")
    assert found is not None and found.fn is summarize and not found.is_async
    assert registry.names() == ["reports.summarize"]
    registry.register("reports.summarize", summarize)  # the same function again: fine


def test_a_name_cannot_be_taken_twice_or_be_malformed() -> None:
    registry = ActionRegistry()
    registry.register("a", lambda ctx, input: {})
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a", lambda ctx, input: {"other": True})
    for bad in ("", "1abc", "has space", "x" * 129, "../etc"):
        with pytest.raises(ValueError, match="invalid action name"):
            registry.register(bad, lambda ctx, input: {})


def test_the_default_registry_backs_the_decorator() -> None:
    @action("tests.worker.default-registry")
    async def fn(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {}

    found = DEFAULT_REGISTRY.get("tests.worker.default-registry")
    assert found is not None and found.is_async


def test_context_cancellation_signal() -> None:
    ctx = make_ctx()
    assert not ctx.cancelled
    ctx.raise_if_cancelled()
    ctx._cancel()
    assert ctx.cancelled and ctx.wait_cancelled(0)
    with pytest.raises(ActionCancelled):
        ctx.raise_if_cancelled()
    # A broad `except Exception` in user code does not swallow it.
    assert not issubclass(ActionCancelled, Exception)
    assert 59 < make_ctx().time_remaining() <= 60


# --- python executor ------------------------------------------------------------------


async def test_sync_actions_run_in_a_thread_with_the_log_context() -> None:
    registry = ActionRegistry()
    seen: dict[str, Any] = {}

    @registry.action("sync")
    def sync(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        seen["thread"] = threading.get_ident()
        seen["fields"] = dict(bound_fields())
        return {"doubled": input["n"] * 2}

    executor = PythonExecutor(registry, max_threads=2)
    try:
        token = bind(run_id="r-ctx")
        try:
            assert await executor.execute(make_ctx("sync"), {"n": 21}) == {"doubled": 42}
        finally:
            unbind(token)
    finally:
        executor.close()
    assert seen["thread"] != threading.get_ident()
    assert seen["fields"]["run_id"] == "r-ctx"


async def test_async_actions_run_on_the_loop() -> None:
    registry = ActionRegistry()

    @registry.action("async")
    async def run(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"attempt": ctx.attempt, "thread": threading.get_ident()}

    out = await PythonExecutor(registry).execute(make_ctx("async", attempt=2), {})
    assert out == {"attempt": 2, "thread": threading.get_ident()}


async def test_unknown_actions_are_permanent_failures_naming_them() -> None:
    registry = ActionRegistry()
    registry.register("known", lambda ctx, input: {})
    with pytest.raises(PermanentError, match=r"unknown action 'nope'.*known"):
        await PythonExecutor(registry).execute(make_ctx("nope"), {})


async def test_a_cancelled_sync_action_sees_the_signal() -> None:
    registry = ActionRegistry()
    stopped = threading.Event()

    @registry.action("loop")
    def loop(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        while True:
            try:
                ctx.raise_if_cancelled()
            except ActionCancelled:
                stopped.set()
                raise
            time.sleep(0.005)

    executor = PythonExecutor(registry)
    ctx = make_ctx("loop")
    task = asyncio.create_task(executor.execute(ctx, {}))
    await asyncio.sleep(0.05)
    ctx._cancel()  # what the runtime does when it gives the lease up
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(stopped.wait, 5)
    executor.close()
