"""A task's output stream from a position to its end, across reconnects (DESIGN.md §15).

WatchStream sends the chunks stored from `from_offset` on, then live ones, framed by
attempt boundaries, and ends once the task has ended. When the call breaks (a server
restart, a balancer dropping it) it is opened again at the position after the last chunk
received, on whichever replica answers, so no chunk is missed or repeated; boundaries the
server sends again after a resume are dropped here, so each arrives once.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from awp.v1 import runs_pb2, streams_pb2
from awp_sdk.connection import Channel, iterate
from awp_sdk.enums import AttemptState, TaskState, decode
from awp_sdk.errors import DeadlineExceeded, Unavailable, is_transient
from awp_sdk.watch import GIVE_UP_AFTER_S, RECONNECT_INITIAL_S, RECONNECT_MAX_S, ReconnectHandler


@dataclass(frozen=True)
class StreamChunk:
    """One chunk: `data` is the text, or the JSON value, the action wrote."""

    position: int  # in the task's stream; resume from position + 1
    attempt: int
    offset: int  # within its attempt
    data: Any
    is_json: bool


@dataclass(frozen=True)
class AttemptBoundary:
    """An attempt's stream began, or ended (`state` says how: a reader drops the partial
    output of an attempt that ended other than "succeeded")."""

    attempt: int
    kind: Literal["started", "ended"]
    position: int
    state: AttemptState | None = None  # "ended" only
    error_message: str = ""


StreamItem = StreamChunk | AttemptBoundary

_TASK_ENDED = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED, TaskState.SKIPPED}
)


def _chunk(chunk: streams_pb2.StreamChunk) -> StreamChunk:
    is_json = chunk.WhichOneof("data") == "json"
    data = json.loads(chunk.json) if is_json else chunk.text
    return StreamChunk(chunk.position, chunk.attempt, chunk.attempt_offset, data, is_json)


def _boundary(boundary: streams_pb2.StreamBoundary) -> AttemptBoundary:
    ended = boundary.kind == streams_pb2.STREAM_BOUNDARY_KIND_ENDED
    state = decode(AttemptState, boundary.state) if ended else None
    return AttemptBoundary(
        boundary.attempt,
        "ended" if ended else "started",
        boundary.position,
        state,
        boundary.error_message,
    )


async def task_stream(
    channel: Channel,
    run_id: str,
    task_key: str,
    *,
    from_offset: int = 0,
    give_up_after: float = GIVE_UP_AFTER_S,
    on_reconnect: ReconnectHandler | None = None,
) -> AsyncIterator[StreamItem]:
    """The task's stream from position from_offset until the task has ended."""
    position = from_offset
    seen: set[tuple[int, str]] = set()
    failing_since: float | None = None
    delay = RECONNECT_INITIAL_S

    async def pause(error: Exception, code: grpc.StatusCode | None) -> None:
        nonlocal failing_since, delay
        now = time.monotonic()
        failing_since = failing_since or now
        if now - failing_since > give_up_after:
            raise error
        if on_reconnect is not None:
            what = code.name if code is not None else type(error).__name__
            on_reconnect(f"stream lost ({what}); resuming at position {position}")
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, RECONNECT_MAX_S)

    while True:
        call = channel.stream(
            channel.control.WatchStream,
            streams_pb2.WatchStreamRequest(run_id=run_id, task_key=task_key, from_offset=position),
        )
        try:
            async for answer in iterate(call):
                failing_since, delay = None, RECONNECT_INITIAL_S
                if answer.HasField("boundary"):
                    boundary = _boundary(answer.boundary)
                    if (boundary.attempt, boundary.kind) not in seen:
                        seen.add((boundary.attempt, boundary.kind))
                        yield boundary
                for chunk in answer.chunks:
                    position = chunk.position + 1
                    yield _chunk(chunk)
        except grpc.aio.AioRpcError as error:
            if not is_transient(error):
                raise channel.error(error) from None
            await pause(channel.error(error), error.code())
            continue
        # The stream ends once the task has; a server shutting down may end it early.
        try:
            if await _task_ended(channel, run_id, task_key):
                return
        except (Unavailable, DeadlineExceeded) as error:
            await pause(error, error.code)


async def _task_ended(channel: Channel, run_id: str, task_key: str) -> bool:
    answer = await channel.call(
        channel.control.ListTasks, runs_pb2.ListTasksRequest(run_id=run_id, page_size=1000)
    )
    while True:
        for task in answer.tasks:
            if task.key == task_key:
                return decode(TaskState, task.state) in _TASK_ENDED
        if not answer.next_page_token:
            return True  # gone (retention): nothing more will come
        answer = await channel.call(
            channel.control.ListTasks,
            runs_pb2.ListTasksRequest(
                run_id=run_id, page_size=1000, page_token=answer.next_page_token
            ),
        )
