"""Unit-testing actions without a server: ``ActionEnvironment`` runs an action as a
worker would, in the test's own process.

    from awp_sdk.testing import ActionEnvironment

    env = ActionEnvironment(run_input={"name": "Ada"}, upstream={"fetch": {"n": 2}})
    assert env.run(greet, {"polite": True}) == {"greeting": "hello, Ada"}

The action gets a real ``ActionContext`` (the class the worker hands it, so its surface
cannot drift from the worker's), built as the worker builds one: the JSON values it
reads (input, run_input, upstream) are what a lease would carry, so a tuple reads as a
list and an integer stays exact. What it returns is checked and converted as the worker
reports it (``OutputError`` for a value the worker would refuse: not a JSON object, over
1 MiB) and handed back as the downstream tasks would read it. Its exceptions propagate
unchanged (RetryableError, PermanentError, KeyError...): the test decides what they
mean. ``cancel()`` does what a worker does when the lease is revoked, ``logs`` holds
what the action logged through ``ctx.logger``, as a failure's log tail would, and
``streamed`` what it wrote to ``ctx.stream``, as a reader receives it. ``checkpoints``
holds the memos of its steps (``ctx.step``), kept across runs as a task's are across
attempts: a second ``run`` replays them (``savings`` says what the last run replayed).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
from collections.abc import AsyncIterable, Iterable, Iterator, Mapping
from typing import Any

from awp_protocol.jsonvalue import struct_to_dict, to_struct
from awp_protocol.names import idempotency_key
from awp_sdk.actions import (
    ActionContext,
    ActionFunc,
    _is_async,
    output_struct,
    running,
    stream_chunk,
)
from awp_sdk.replay import Checkpoint, Replay, Savings, Usage
from awp_sdk.waits import WaitSpec


def _as_leased(value: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """A JSON object as the worker reads it from a lease (a Struct and back)."""
    return struct_to_dict(to_struct(dict(value or {}), where))


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class _RecordedStream:
    """``ctx.stream`` of a test: each chunk checked as the worker checks it, and kept as
    a reader receives it (a JSON chunk read back)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = chunks

    def write(self, chunk: Any) -> None:
        text, is_json = stream_chunk(chunk)
        self._chunks.append(json.loads(text) if is_json else text)

    async def awrite(self, chunk: Any) -> None:
        self.write(chunk)

    def pipe(self, chunks: Iterable[Any]) -> int:
        count = 0
        for chunk in chunks:
            self.write(chunk)
            count += 1
        return count

    async def apipe(self, chunks: AsyncIterable[Any]) -> int:
        count = 0
        async for chunk in chunks:
            self.write(chunk)
            count += 1
        return count


class _MemoryStore:
    """The checkpoints of a test's task, in a list (the worker's are LoadCheckpoints and
    RecordStep)."""

    def __init__(self, checkpoints: list[Checkpoint], attempt: int) -> None:
        self._checkpoints = checkpoints
        self._attempt = attempt

    async def load(self) -> list[Checkpoint]:
        return list(self._checkpoints)

    async def record_step(
        self, name: str, occurrence: int, value_json: str, usage: Usage
    ) -> Checkpoint | None:
        for stored in self._checkpoints:
            if (stored.kind, stored.name, stored.occurrence) == ("step", name, occurrence):
                return stored
        value = json.loads(value_json)
        self._checkpoints.append(
            Checkpoint("step", name, occurrence, value, usage, attempt=self._attempt)
        )
        return None

    async def await_wait(self, spec: WaitSpec, replayed: Savings) -> Checkpoint | None:
        """A sleep ends at once (a test does not wait for the clock); a signal or an
        approval suspends the attempt: add its checkpoint (``Checkpoint("signal", name,
        0, payload)``) to the checkpoints and run the action again."""
        if spec.kind != "sleep":
            return None
        woke = Checkpoint("sleep", "", spec.occurrence, {"woke_at": "now"}, attempt=self._attempt)
        self._checkpoints.append(woke)
        return woke


class ActionEnvironment:
    """What the attempt under test is: its run, task, attempt and the JSON it reads. Each
    ``run`` hands the action a fresh context with ``timeout`` seconds to its deadline;
    ``log_level`` is the level ``ctx.logger`` records at while it runs (a worker's is its
    --log-level)."""

    def __init__(
        self,
        *,
        run_input: Mapping[str, Any] | None = None,
        upstream: Mapping[str, Mapping[str, Any]] | None = None,
        upstream_states: Mapping[str, str] | None = None,
        run_id: str = "run-test",
        task_key: str = "task",
        action: str = "test.action",
        attempt: int = 1,
        max_attempts: int = 3,
        fencing_token: int = 1,
        worker_id: str = "worker-test",
        timeout: float = 300.0,
        log_level: int = logging.INFO,
    ) -> None:
        self.run_input = _as_leased(run_input, "run_input")
        self.upstream = {
            key: _as_leased(output, f"upstream.{key}") for key, output in (upstream or {}).items()
        }
        # Tasks this one depends on succeeded unless said otherwise (an always task's may not).
        self.upstream_states = {key: "succeeded" for key in self.upstream} | dict(
            upstream_states or {}
        )
        self.run_id = run_id
        self.task_key = task_key
        self.action = action
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.fencing_token = fencing_token
        self.worker_id = worker_id
        self.timeout = timeout
        self.log_level = log_level
        # What the action logged through ctx.logger during the last run, oldest first.
        self.logs: list[str] = []
        # What the action wrote to ctx.stream, in order (every run's).
        self.streamed: list[Any] = []
        # The task's memos (every run's), and what the last run replayed of them.
        self.checkpoints: list[Checkpoint] = []
        self.savings = Savings()
        self._context: ActionContext | None = None
        self._replay: Replay | None = None
        self._task: asyncio.Task[Any] | None = None

    def context(self) -> ActionContext:
        """A context for one attempt, as the worker makes it from a lease."""
        return ActionContext(
            run_id=self.run_id,
            task_key=self.task_key,
            action=self.action,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            idempotency_key=idempotency_key(self.run_id, self.task_key),
            fencing_token=self.fencing_token,
            deadline=time.monotonic() + self.timeout,
            worker_id=self.worker_id,
            run_input=self.run_input,
            upstream=self.upstream,
            upstream_states=self.upstream_states,
            stream=_RecordedStream(self.streamed),
            replay=self._replay,
        )

    def run(self, fn: ActionFunc, input: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Runs a sync or async action to its end, on an event loop of its own, and
        returns its output as downstream tasks would read it (from inside a running
        event loop, await ``run_async``)."""
        return asyncio.run(self.run_async(fn, input))

    async def run_async(
        self, fn: ActionFunc, input: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """``run`` from inside a running event loop. As on a worker, a sync action runs in
        a thread of its own and an async one as a task of the loop, which ``cancel()``
        cancels and which ends with TimeoutError once ``timeout`` passes."""
        replay = self._replay = Replay(
            _MemoryStore(self.checkpoints, self.attempt), asyncio.get_running_loop()
        )
        with self._running() as ctx, running(ctx):
            leased = _as_leased(input, "input")
            try:
                if _is_async(fn):
                    output = fn(ctx, leased)
                else:
                    output = await asyncio.to_thread(fn, ctx, leased)
                if inspect.isawaitable(output):  # async, or a sync wrapper of an async action
                    self._task = asyncio.ensure_future(output)
                    try:
                        async with asyncio.timeout(self.timeout):
                            output = await self._task
                    finally:
                        self._task = None
            finally:
                self.savings = replay.savings
        return struct_to_dict(output_struct(output))

    def cancel(self) -> None:
        """What a worker does once the lease is revoked: ``ctx.cancelled`` turns True
        (``raise_if_cancelled`` raises ActionCancelled) and a running async action is
        cancelled. Call it from the action, another task or another thread."""
        if self._context is not None:
            self._context._cancel()
        if self._task is not None:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    @contextlib.contextmanager
    def _running(self) -> Iterator[ActionContext]:
        """One attempt's context, held for cancel(), its ctx.logger lines kept in logs."""
        ctx = self.context()
        handler = _Collect(self.logs)
        level = ctx.logger.level
        self.logs.clear()
        self._context = ctx
        ctx.logger.addHandler(handler)
        ctx.logger.setLevel(self.log_level)
        try:
            yield ctx
        finally:
            ctx.logger.removeHandler(handler)
            ctx.logger.setLevel(level)
            self._context = None
