"""What a failed attempt reports beyond its message: the exception's type, a traceback
from the action's frame on (cut from the outside in at its bound), and the action's own
last log lines, kept apart from every other attempt's."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from awp.v1 import worker_pb2
from awp_protocol.limits import MAX_ERROR_TYPE_CHARS, MAX_TRACEBACK_CHARS
from awp_worker import ActionContext, PermanentError, RetryableError
from awp_worker._diagnostics import (
    LogTail,
    action_traceback,
    collecting,
    exception_type,
    keep_innermost,
)
from awp_worker._executors import MockExecutor, PythonExecutor, failure_from_exception
from awp_worker._sdk import ActionRegistry

HEAD = "Traceback (most recent call last):\n"


def make_ctx(action: str, task_key: str = "t") -> ActionContext:
    return ActionContext(
        run_id="r",
        task_key=task_key,
        action=action,
        attempt=1,
        max_attempts=1,
        idempotency_key=f"r/{task_key}",
        fencing_token=1,
        deadline=time.monotonic() + 60,
    )


class QuotaExceeded(PermanentError):
    pass


def test_the_type_is_named_as_code_would_name_it() -> None:
    assert exception_type(KeyError("k")) == "KeyError"
    assert exception_type(QuotaExceeded("q")) == f"{__name__}.QuotaExceeded"
    # The SDK's own classes only say whether to retry: their message is the news.
    assert exception_type(PermanentError("p")) == exception_type(RetryableError("r")) == ""
    named = type("E" * 400, (Exception,), {})("x")
    assert len(exception_type(named)) == MAX_ERROR_TYPE_CHARS


@given(
    st.lists(st.text(alphabet="abc \u00e9\u2603", max_size=300), max_size=300),
    st.integers(min_value=200, max_value=5_000),
)
def test_a_cut_traceback_keeps_its_first_line_and_innermost_frames(
    frames: list[str], limit: int
) -> None:
    text = HEAD + "".join(f"  {frame}\n" for frame in frames) + "KeyError: 'missing'\n"
    cut = keep_innermost(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
        return
    head, marker, *rest = cut.splitlines(keepends=True)
    assert head == HEAD and cut.endswith("KeyError: 'missing'\n")
    kept = "".join(rest)
    assert text.endswith(kept)
    assert marker == f"  ... [{len(text) - len(HEAD) - len(kept)} characters of outer frames cut]\n"


def test_a_log_tail_keeps_the_newest_whole_lines_within_its_bounds() -> None:
    tail = LogTail(max_lines=3, max_chars=1000)
    tail.write("pri")
    tail.write("nted\nsecond")
    tail.add_record("record one\n  its traceback")
    tail.write(" half\x00line")
    assert tail.text() == "record one\n  its traceback\nsecond half\\x00line"
    short = LogTail(max_lines=50, max_chars=25)
    for n in range(10):
        short.add_record(f"line {n:02d} ....")
    assert short.text() == "line 08 ....\nline 09 ...."


async def failure_of(execution: Awaitable[object]) -> Exception:
    """The exception an execution raised, as the worker's own frame that awaits it catches
    it (this test's frame left out of its traceback, as the worker's is)."""
    try:
        await execution
    except Exception as exc:
        assert exc.__traceback__ is not None
        return exc.with_traceback(exc.__traceback__.tb_next)
    raise AssertionError("the execution did not raise")


async def raise_from_an_action(fn: Any) -> Exception:
    registry = ActionRegistry()
    registry.register("boom", fn)
    executor = PythonExecutor(registry)
    try:
        return await failure_of(executor.execute(make_ctx("boom"), {}))
    finally:
        executor.close()


def deep(data: dict[str, Any]) -> Any:
    return data["missing"]


def sync_action(ctx: ActionContext, input: dict[str, Any]) -> Any:
    return deep({})


async def async_action(ctx: ActionContext, input: dict[str, Any]) -> Any:
    return deep({})


@pytest.mark.parametrize("fn", [sync_action, async_action], ids=["sync", "async"])
async def test_the_traceback_starts_at_the_actions_frame(fn: Any) -> None:
    exc = await raise_from_an_action(fn)
    traceback = action_traceback(exc)
    frames = [line.rsplit(" ", 1)[-1] for line in traceback.splitlines() if "  File " in line]
    assert frames == [fn.__name__, "deep"]  # not the executor's, asyncio's or the pool's
    assert traceback.startswith(HEAD) and traceback.endswith("KeyError: 'missing'\n")
    result = failure_from_exception(worker_pb2.Lease(dispatch_id=1), exc, "a line")
    assert (result.error.type, result.error.traceback, result.error.log_tail) == (
        "KeyError",
        traceback,
        "a line",
    )


async def test_failures_of_the_worker_itself_carry_no_traceback() -> None:
    mock = await failure_of(MockExecutor().execute(make_ctx("noop"), {"fail": "asked to"}))
    unknown = await failure_of(PythonExecutor(ActionRegistry()).execute(make_ctx("nope"), {}))
    for exc in (mock, unknown):
        assert isinstance(exc, PermanentError) and action_traceback(exc) == ""


async def test_a_huge_traceback_is_cut_at_its_bound() -> None:
    def recurse(n: int) -> Any:
        if n == 0:
            raise ValueError("bottom")
        return other(n - 1)

    def other(n: int) -> Any:
        return recurse(n)

    exc = await raise_from_an_action(lambda ctx, input: recurse(300))
    traceback = action_traceback(exc)
    assert MAX_TRACEBACK_CHARS - 200 < len(traceback) <= MAX_TRACEBACK_CHARS
    assert traceback.endswith("ValueError: bottom\n")


async def test_concurrent_attempts_keep_their_own_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    registry = ActionRegistry()
    other_logger = logging.getLogger("some.library")
    both_running = asyncio.Barrier(2)
    started = asyncio.Event()

    def sync_action(ctx: ActionContext, input: dict[str, Any]) -> Any:
        for n in range(3):
            ctx.logger.info("sync says %d", n)
        return {}

    async def async_action(ctx: ActionContext, input: dict[str, Any]) -> Any:
        started.set()
        await both_running.wait()
        other_logger.warning("async says hello")
        await asyncio.sleep(0)
        other_logger.warning("async says bye")
        return {}

    registry.register("sync", sync_action)
    registry.register("async", async_action)
    executor = PythonExecutor(registry)

    async def attempt(action: str, tail: LogTail, wait: bool = False) -> None:
        if wait:
            await started.wait()
        with collecting(tail):
            if wait:
                await both_running.wait()
            await executor.execute(make_ctx(action, task_key=action), {})

    sync_tail, async_tail = LogTail(), LogTail()
    try:
        await asyncio.gather(attempt("async", async_tail), attempt("sync", sync_tail, wait=True))
    finally:
        executor.close()
    logging.getLogger("awp_worker.attempt").info("the worker's own line, outside any attempt")
    assert [line.split(": ", 1)[1] for line in sync_tail.text().splitlines()] == [
        "sync says 0",
        "sync says 1",
        "sync says 2",
    ]
    assert [line.split(": ", 1)[1] for line in async_tail.text().splitlines()] == [
        "async says hello",
        "async says bye",
    ]
