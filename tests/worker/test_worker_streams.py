"""ctx.stream against the real server and PostgreSQL: chunks from sync and async actions
stored in order before the result, a lost lease stopping the attempt, and the writer's
buffer bounded while appends wait (DESIGN.md §15)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from test_worker_integration import run_state, server, start_worker, worker_config

from awp.v1 import session_pb2, streams_pb2, worker_pb2
from awp_coordinator.coordinator import Coordinator
from awp_db.connect import Pool
from awp_protocol.limits import MAX_STREAM_BYTES_PER_ATTEMPT, MAX_STREAM_CHUNK_CHARS
from awp_sdk.actions import ActionCancelled, ActionRegistry
from awp_worker import ActionContext
from awp_worker._executors import PythonExecutor
from awp_worker._lifecycle import EXIT_OK
from awp_worker._stream import StreamLost, StreamSettings, StreamTooLarge, StreamWriter
from kit import ServerHandle, poll_until, spec, start_run
from kit.invariants import check_committed

__all__ = ["server"]  # a fixture


async def stored(pool: Pool, run_id: object) -> list[tuple[str, int, bool, str]]:
    rows = await pool.fetch(
        """SELECT t.key, c.attempt, c.is_json, c.data FROM stream_chunks c
             JOIN tasks t ON t.id = c.task_id WHERE c.run_id = $1
            ORDER BY t.key, c.position""",
        run_id,
    )
    return [tuple(row) for row in rows]  # type: ignore[misc]


async def test_sync_and_async_actions_stream_before_their_result(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    registry = ActionRegistry()

    @registry.action("tokens")
    def tokens(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        if ctx.task_key == "t0":
            count = ctx.stream.pipe(f"tok{i} " for i in range(200))
            ctx.stream.write({"done": True})
            return {"n": count}
        raise AssertionError("t1 is async")

    @registry.action("atokens")
    async def atokens(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        async def model() -> AsyncIterator[str]:
            for i in range(50):
                yield f"a{i}"

        return {"n": await ctx.stream.apipe(model())}

    workflow = spec("st", tasks=2, kind="python")
    first, second = workflow.tasks
    workflow = replace(
        workflow, tasks=(replace(first, action="tokens"), replace(second, action="atokens"))
    )
    run_id = await start_run(pool, workflow)
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    chunks = await stored(pool, run_id)
    assert [c[3] for c in chunks if c[0] == "t0"] == [
        *(f"tok{i} " for i in range(200)),
        '{"done": true}',
    ]
    assert chunks[200][2] is True
    assert [c[3] for c in chunks if c[0] == "t1"] == [f"a{i}" for i in range(50)]
    batches = await pool.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM stream_chunks WHERE run_id = $1", run_id
    )
    assert batches < 250, "chunks are batched, not one transaction each"
    await check_committed(pool)


async def test_a_lost_lease_stops_the_attempt_and_stores_nothing_after(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    registry = ActionRegistry()
    wrote = threading.Event()
    go_on = threading.Event()
    outcome: list[str] = []

    @registry.action("noop")
    def writer(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        if ctx.attempt > 1:
            ctx.stream.write("second")
            return {}
        ctx.stream.write("before")
        wrote.set()
        go_on.wait(30)
        try:
            for i in range(1000):
                ctx.stream.write(f"after{i}")
                if ctx.wait_cancelled(0.01):
                    break
            ctx.raise_if_cancelled()
        except ActionCancelled:
            outcome.append("cancelled")
            raise
        outcome.append("finished")
        return {}

    run_id = await start_run(pool, spec("lost", tasks=1, kind="python", max_attempts=2))
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    await poll_until(wrote.is_set, what="the first chunk written")
    await poll_until(lambda: pool.fetchval("SELECT count(*) FROM stream_chunks"))
    # The lease ends on the database clock (as a revocation would); the heartbeat
    # renews nothing past it.
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE state = 'leased'"
    )
    go_on.set()
    await poll_until(lambda: outcome, what="the attempt stopped")
    assert outcome == ["cancelled"]
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    chunks = await stored(pool, run_id)
    assert chunks == [("t0", 1, False, "before"), ("t0", 2, False, "second")]
    await check_committed(pool)


async def test_the_buffer_is_bounded_while_appends_wait() -> None:
    release = asyncio.Event()
    sent: list[int] = []

    async def slow(request: streams_pb2.AppendStreamRequest) -> streams_pb2.AppendStreamResponse:
        await release.wait()
        sent.append(len(request.chunks))
        return streams_pb2.AppendStreamResponse(
            outcome=session_pb2.COMPLETE_OUTCOME_ACCEPTED,
            next_offset=request.first_offset + len(request.chunks),
        )

    settings = StreamSettings(linger_s=0.001, batch_bytes=4096, max_buffered_bytes=16 * 1024)
    writer = StreamWriter(
        worker_pb2.Lease(dispatch_id=1, lease_token="t", attempt=1),
        slow,
        lambda _: None,
        settings,
        {},
    )
    written = 0

    async def produce() -> None:
        nonlocal written
        for _ in range(1000):
            await writer.awrite("x" * 1000)
            written += 1

    producer = asyncio.create_task(produce())
    await poll_until(lambda: written >= 10, what="the buffer filled")
    await asyncio.sleep(0.2)  # the producer stays blocked: nothing more is accepted
    assert written <= 17
    assert writer._buffered <= settings.max_buffered_bytes
    release.set()
    await asyncio.wait_for(producer, 30)
    await asyncio.wait_for(writer.flush(), 30)
    assert sum(sent) == 1000
    writer.close()


@pytest.mark.parametrize("chunk", [float("nan"), object(), "x" * 70_000])
async def test_a_chunk_that_cannot_be_stored_is_refused_at_once(chunk: object) -> None:
    async def never(request: streams_pb2.AppendStreamRequest) -> streams_pb2.AppendStreamResponse:
        raise AssertionError("nothing is sent")

    writer = StreamWriter(worker_pb2.Lease(), never, lambda _: None, StreamSettings(), {})
    with pytest.raises(ValueError, match="stream chunk"):
        await writer.awrite(chunk)


async def test_more_than_an_attempt_may_stream_fails_the_action_at_once() -> None:
    async def store(request: streams_pb2.AppendStreamRequest) -> streams_pb2.AppendStreamResponse:
        return streams_pb2.AppendStreamResponse(
            outcome=session_pb2.COMPLETE_OUTCOME_ACCEPTED,
            next_offset=request.first_offset + len(request.chunks),
        )

    writer = StreamWriter(
        worker_pb2.Lease(), store, lambda _: None, StreamSettings(max_buffered_bytes=1 << 30), {}
    )
    chunk = "z" * MAX_STREAM_CHUNK_CHARS
    for _ in range(MAX_STREAM_BYTES_PER_ATTEMPT // len(chunk)):
        await writer.awrite(chunk)
    with pytest.raises(StreamTooLarge, match="more than the 16777216 an attempt may stream"):
        await writer.awrite("one byte too many")
    await asyncio.wait_for(writer.flush(), 60)
    writer.close()


async def test_a_sync_write_after_the_stream_is_lost_raises_stream_lost() -> None:
    # StreamLost is an ActionCancelled, a CancelledError: raised by the coroutine a sync
    # write runs on the loop, it used to reach the action's thread as a bare
    # concurrent.futures.CancelledError that `except ActionCancelled` missed.
    async def refuse(request: streams_pb2.AppendStreamRequest) -> streams_pb2.AppendStreamResponse:
        return streams_pb2.AppendStreamResponse(outcome=session_pb2.COMPLETE_OUTCOME_LEASE_LOST)

    lost: list[str] = []
    writer = StreamWriter(worker_pb2.Lease(attempt=1), refuse, lost.append, StreamSettings(), {})
    await writer.awrite("refused")
    await poll_until(lambda: lost, what="the append refused")

    def write_from_a_thread() -> BaseException | None:
        try:
            writer.write("after")
        except BaseException as exc:  # the test inspects what the action would see
            return exc
        return None

    raised = await asyncio.to_thread(write_from_a_thread)
    assert isinstance(raised, StreamLost), repr(raised)
    assert isinstance(raised, ActionCancelled)
