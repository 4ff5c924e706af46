"""Executors by kind, and the conversion of what they return into a TaskResult.

An executor is anything with ``async execute(ctx, input) -> object``: it returns the
output (checked by awp_sdk.actions.output_struct, which awp_sdk.testing applies too: it
must be a JSON object) or raises. ``RetryableError`` and
ordinary exceptions become retryable failures, ``PermanentError`` a final one.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from google.protobuf import struct_pb2

from awp.v1 import types_pb2, worker_pb2
from awp_protocol.limits import MAX_ERROR_MESSAGE_CHARS, MAX_OUTPUT_BYTES
from awp_sdk.actions import (
    DEFAULT_REGISTRY,
    ActionContext,
    ActionRegistry,
    PermanentError,
    RetryableError,
    running,
)
from awp_worker._diagnostics import action_traceback, exception_type


class Executor(Protocol):
    async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
        """Run one attempt; return a JSON object or raise."""
        ...


# --- results --------------------------------------------------------------------------


def success(lease: worker_pb2.Lease, output: struct_pb2.Struct) -> worker_pb2.TaskResult:
    return worker_pb2.TaskResult(
        dispatch_id=lease.dispatch_id,
        lease_token=lease.lease_token,
        outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
        output=output,
    )


def with_reports(result: worker_pb2.TaskResult, ctx: ActionContext) -> worker_pb2.TaskResult:
    """The result carrying what the action reported of its rate limits (usage, slow-down)."""
    for limit, units in sorted(ctx.reported_usage.items()):
        result.usage.add(limit=limit, units=units)
    for limit, seconds in sorted(ctx.slowed_down.items()):
        slow = result.slow_down.add(limit=limit)
        slow.retry_after.FromMilliseconds(max(1, round(seconds * 1000)))
    return result


def failure(
    lease: worker_pb2.Lease,
    message: str,
    *,
    retryable: bool,
    error_type: str = "",
    traceback: str = "",
    log_tail: str = "",
) -> worker_pb2.TaskResult:
    """A FAILED result. type, traceback and log_tail come bounded (awp_worker._diagnostics)."""
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[: MAX_ERROR_MESSAGE_CHARS - 15] + " ...[truncated]"
    return worker_pb2.TaskResult(
        dispatch_id=lease.dispatch_id,
        lease_token=lease.lease_token,
        outcome=worker_pb2.RESULT_OUTCOME_FAILED,
        error=types_pb2.TaskError(
            message=message or "failed",
            retryable=retryable,
            type=error_type,
            traceback=traceback,
            log_tail=log_tail,
        ),
    )


def failure_from_exception(
    lease: worker_pb2.Lease, exc: Exception, log_tail: str = ""
) -> worker_pb2.TaskResult:
    """Permanent for PermanentError (and bad output), retryable for everything else; with
    the exception's type and traceback, and the action's last log lines."""
    details = {
        "error_type": exception_type(exc),
        "traceback": action_traceback(exc),
        "log_tail": log_tail,
    }
    if isinstance(exc, PermanentError):
        return failure(lease, str(exc) or type(exc).__name__, retryable=False, **details)
    if isinstance(exc, RetryableError):
        return failure(lease, str(exc) or type(exc).__name__, retryable=True, **details)
    text = str(exc)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return failure(lease, message, retryable=True, **details)


# --- mock ---------------------------------------------------------------------------


class MockExecutor:
    """Deterministic results for tests and benchmarks.

    Output: ``{"action": ..., "echo": input, "attempt": n}``. Input fields:
    ``sleep_ms`` sleeps first (cancellable); ``fail`` (a message or ``true``) fails
    permanently; ``fail_attempts: N`` fails retryably while the attempt is <= N;
    ``output_bytes: N`` adds ``"padding"``, N hex digits, to the output (large outputs
    without large inputs, for the payload benchmark); ``stream_chunks: N`` first writes N
    chunks ``"<attempt>:<i> "`` to the output stream, one every ``stream_every_ms`` (on a
    fixed schedule), each padded to ``stream_chunk_bytes``; ``stream_stamp: true`` puts the
    wall-clock time of the write in each, ``"<attempt>:<i>@<epoch seconds> "`` (the stream
    tests and benchmark); ``steps: N`` spends the sleep in N memoised steps
    (``ctx.step("mock.nap")``, sleep_ms / N each): a later attempt replays the naps an
    earlier one finished and sleeps only the rest (the fault workloads, the replay
    benchmark); ``report_usage: {LIMIT: UNITS}`` and ``slow_down: {LIMIT:
    SECONDS}`` report rate-limit usage and a slow-down with the result (the flow tests);
    ``wait_sleep_ms: N`` then sleeps N ms as a durable wait (``ctx.sleep``,
    holding no slot) and ``wait_signal: NAME`` waits for the signal NAME
    (``ctx.wait_for_signal``), its payload put in the output as ``"signal"`` (the fault
    workloads, the waits benchmark).
    """

    async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
        every_s = _number(input, "stream_every_ms") / 1000
        pad = int(_number(input, "stream_chunk_bytes"))
        stamp = input.get("stream_stamp") is True
        loop = asyncio.get_running_loop()
        began = loop.time()
        for index in range(int(_number(input, "stream_chunks"))):
            written = f"@{time.time():.6f}" if stamp else ""
            await ctx.stream.awrite(f"{ctx.attempt}:{index}{written} ".ljust(pad, "."))
            if every_s > 0:
                await asyncio.sleep(max(0.0, began + (index + 1) * every_s - loop.time()))
        sleep_ms = _number(input, "sleep_ms")
        steps = int(_number(input, "steps"))
        for _ in range(steps):
            await ctx.step("mock.nap", _nap, sleep_ms / steps / 1000)
        if sleep_ms > 0 and not steps:
            await asyncio.sleep(sleep_ms / 1000)
        wait_sleep_ms = _number(input, "wait_sleep_ms")
        if wait_sleep_ms > 0:
            await ctx.sleep(wait_sleep_ms / 1000)
        signal_name = input.get("wait_signal")
        payload = None if signal_name is None else await ctx.wait_for_signal(str(signal_name))
        fail = input.get("fail")
        if fail is not None and fail is not False:
            if isinstance(fail, str) and fail:
                raise PermanentError(fail)
            if fail is True:
                raise PermanentError("mock failure requested by input.fail")
            raise PermanentError(f"mock: input.fail must be a string or true, got {fail!r}")
        fail_attempts = _number(input, "fail_attempts")
        if ctx.attempt <= fail_attempts:
            raise RetryableError(
                f"mock retryable failure: attempt {ctx.attempt} <= fail_attempts {fail_attempts:g}"
            )
        for limit, units in _mapping(input, "report_usage").items():
            ctx.report_usage(limit, int(units))
        for limit, seconds in _mapping(input, "slow_down").items():
            ctx.slow_down(limit, float(seconds))
        output: dict[str, Any] = {"action": ctx.action, "echo": input, "attempt": ctx.attempt}
        if signal_name is not None:
            output["signal"] = payload
        padding = int(_number(input, "output_bytes"))
        if padding > MAX_OUTPUT_BYTES:
            raise PermanentError(
                f"mock: input.output_bytes must be at most {MAX_OUTPUT_BYTES}, got {padding}"
            )
        if padding > 0:
            # Seeded, so the output is the same on every attempt; random, so PostgreSQL
            # cannot compress it away (payload figures would flatter AWP).
            output["padding"] = random.Random(padding).randbytes(padding // 2 + 1).hex()[:padding]
        return output


async def _nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


def _mapping(input: dict[str, Any], name: str) -> dict[str, Any]:
    value = input.get(name) or {}
    if not isinstance(value, dict):
        raise PermanentError(f"mock: input.{name} must be an object, got {value!r}")
    return value


def _number(input: dict[str, Any], name: str) -> float:
    value = input.get(name, 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PermanentError(f"mock: input.{name} must be a number, got {value!r}")
    return float(value)


# --- python ---------------------------------------------------------------------------


class PythonExecutor:
    """Runs functions registered with ``@action``: async ones on the loop, sync ones in
    a thread pool (a cancelled sync action keeps its thread until it returns; it should
    poll ``ctx.cancelled``)."""

    def __init__(self, registry: ActionRegistry | None = None, *, max_threads: int = 8) -> None:
        self.registry = registry if registry is not None else DEFAULT_REGISTRY
        self._max_threads = max(1, max_threads)
        self._pool: ThreadPoolExecutor | None = None

    async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
        registered = self.registry.get(ctx.action)
        if registered is None:
            known = ", ".join(self.registry.names()) or "none"
            raise PermanentError(
                f"unknown action {ctx.action!r} for executor kind 'python' "
                f"(registered here: {known})"
            )
        with running(ctx):  # decorated steps find their context
            if registered.is_async:
                return await registered.fn(ctx, input)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_threads, thread_name_prefix="awp-action")
            loop = asyncio.get_running_loop()
            # The thread sees the task's context variables (log fields among them).
            context = contextvars.copy_context()
            result = await loop.run_in_executor(self._pool, context.run, registered.fn, ctx, input)
            if inspect.isawaitable(result):  # a sync wrapper that returned a coroutine
                result = await result
            return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
