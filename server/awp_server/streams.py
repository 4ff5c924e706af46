"""Output streams on the wire: AppendStream's input, and WatchStream's reader loop
(DESIGN.md §15). The fencing and the storage are awp_db.streams'.

A reader reads PostgreSQL only; a NOTIFY on STREAM_CHANNEL (new chunks of a task) or
RUN_EVENTS_CHANNEL (an attempt or the task ended) just wakes it early, and it re-reads
every poll interval anyway, so any replica serves any stream and a lost notification
costs latency, never data.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from uuid import UUID

from awp.v1 import streams_pb2
from awp_db import runs, streams
from awp_db.connect import Pool
from awp_db.listen import Listener, Waiter
from awp_db.signals import RUN_EVENTS_CHANNEL, STREAM_CHANNEL
from awp_kernel.errors import invalid
from awp_protocol.errors import quote
from awp_protocol.limits import STREAM_READ_BATCH
from awp_protocol.states import TERMINAL_TASK_STATES
from awp_server.convert import ATTEMPT_STATES


def chunks_in(request: streams_pb2.AppendStreamRequest) -> list[streams.ChunkIn]:
    """The request's chunks, or INVALID_ARGUMENT naming the first bad one."""
    if not request.chunks:
        raise invalid("chunks", "must hold at least one chunk")
    if request.first_offset < 0:
        raise invalid("first_offset", f"must be at least 0, got {request.first_offset}")
    found: list[streams.ChunkIn] = []
    for index, chunk in enumerate(request.chunks):
        kind = chunk.WhichOneof("data")
        if kind is None:
            raise invalid(f"chunks[{index}]", "has neither text nor json")
        if kind == "json":
            try:
                json.loads(chunk.json)
            except ValueError as exc:
                raise invalid(f"chunks[{index}].json", f"is not JSON: {exc}") from None
        found.append(streams.ChunkIn(getattr(chunk, kind), kind == "json"))
    return found


class StreamReaders:
    """WatchStream's loop, and the count of readers this server serves."""

    def __init__(self, pool: Pool, listener: Listener, poll_s: float, max_readers: int) -> None:
        self._pool = pool
        self._listener = listener
        self._poll_s = poll_s
        self._max_readers = max_readers
        self.open = 0

    async def watch(
        self, request: streams_pb2.WatchStreamRequest
    ) -> AsyncIterator[streams_pb2.WatchStreamResponse]:
        run_id = runs.parse_run_id(request.run_id)
        if request.from_offset < 0:
            raise invalid("from_offset", f"must be at least 0, got {request.from_offset}")
        if self.open >= self._max_readers:
            raise streams.stream_limit(
                f"this server already serves {self._max_readers} stream readers "
                "(its --max-stream-readers): try another replica or later"
            )
        self.open += 1
        try:
            async for response in self._watch(run_id, request.task_key, request.from_offset):
                yield response
        finally:
            self.open -= 1

    async def _watch(
        self, run_id: UUID, task_key: str, position: int
    ) -> AsyncIterator[streams_pb2.WatchStreamResponse]:
        task = await streams.task(self._pool, run_id, task_key)
        if task is None:
            await runs.progress(self._pool, run_id)  # RUN_NOT_FOUND first
            raise invalid("task_key", f"the run has no task {quote(task_key)}")
        # A resumed reader has seen the attempts before the one that wrote its last chunk.
        first = 0
        if position > 0:
            first = await streams.attempt_at(self._pool, task.id, position - 1) or 0
        started: set[int] = set()
        ended: set[int] = set()
        # Subscribed before the first read: a commit between a read and the wait still
        # wakes the wait at once.
        async with (
            self._listener.subscribe(STREAM_CHANNEL, key=str(task.id)) as new_chunks,
            self._listener.subscribe(RUN_EVENTS_CHANNEL, key=str(run_id)) as run_events,
        ):
            refresh = True
            while True:
                if refresh:
                    # Read in this order: a task ended here has every attempt ended, and an
                    # attempt ended here has every chunk committed, so the chunk reads
                    # below see all of them.
                    now = await streams.task(self._pool, run_id, task_key)
                    done = now is None or now.state in TERMINAL_TASK_STATES
                    marks = {
                        m.attempt: m
                        for m in await streams.attempts(self._pool, task.id)
                        if m.attempt >= first
                    }
                caught_up = True
                while True:
                    rows = await streams.chunks(self._pool, task.id, position, STREAM_READ_BATCH)
                    for attempt, group in itertools.groupby(rows, key=lambda c: c.attempt):
                        # Earlier attempts are over (a later one wrote), but an end is only
                        # sent as read: re-read the attempts if one is not known ended.
                        earlier = sorted(
                            a for a in {*marks, *started} if a < attempt and a not in ended
                        )
                        if any(a not in marks or not marks[a].ended for a in earlier):
                            caught_up = False
                            break
                        for a in earlier:
                            for boundary in _boundaries(marks[a], started, ended, position):
                                yield boundary
                        if attempt not in started:
                            started.add(attempt)
                            yield _started(attempt, position)
                        batch = list(group)
                        yield streams_pb2.WatchStreamResponse(chunks=[_chunk(c) for c in batch])
                        position = batch[-1].position + 1
                    if not caught_up or len(rows) < STREAM_READ_BATCH:
                        break
                if not caught_up:
                    refresh = True
                    continue
                for mark in sorted(marks.values(), key=lambda m: m.attempt):
                    for boundary in _boundaries(mark, started, ended, position):
                        yield boundary
                if done:
                    return
                # New chunks alone need no re-read of the task and its attempts.
                refresh = await _state_may_have_changed(new_chunks, run_events, self._poll_s)


def _boundaries(
    mark: streams.AttemptMark, started: set[int], ended: set[int], position: int
) -> Sequence[streams_pb2.WatchStreamResponse]:
    out = []
    if mark.attempt not in started:
        started.add(mark.attempt)
        out.append(_started(mark.attempt, position))
    if mark.ended and mark.attempt not in ended:
        ended.add(mark.attempt)
        out.append(
            streams_pb2.WatchStreamResponse(
                boundary=streams_pb2.StreamBoundary(
                    attempt=mark.attempt,
                    kind=streams_pb2.STREAM_BOUNDARY_KIND_ENDED,
                    state=ATTEMPT_STATES.proto(mark.state),
                    error_message=mark.error_message or "",
                    position=position,
                )
            )
        )
    return out


def _started(attempt: int, position: int) -> streams_pb2.WatchStreamResponse:
    return streams_pb2.WatchStreamResponse(
        boundary=streams_pb2.StreamBoundary(
            attempt=attempt, kind=streams_pb2.STREAM_BOUNDARY_KIND_STARTED, position=position
        )
    )


def _chunk(chunk: streams.Chunk) -> streams_pb2.StreamChunk:
    message = streams_pb2.StreamChunk(
        position=chunk.position, attempt=chunk.attempt, attempt_offset=chunk.chunk_offset
    )
    if chunk.is_json:
        message.json = chunk.data
    else:
        message.text = chunk.data
    return message


async def _state_may_have_changed(chunks: Waiter, run_events: Waiter, seconds: float) -> bool:
    """Waits until either waiter is woken or seconds pass; False when only new chunks
    woke it (the task and its attempts are as last read), True otherwise (a run event,
    or the poll: a lost notification must not hide an ending)."""
    chunk_wait = asyncio.ensure_future(chunks.wait(seconds))
    event_wait = asyncio.ensure_future(run_events.wait(seconds))
    try:
        await asyncio.wait({chunk_wait, event_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # A cancelled wait leaves its waiter set: the next wait returns at once.
        for wait in (chunk_wait, event_wait):
            wait.cancel()
    woken_by_chunks = chunk_wait.done() and not chunk_wait.cancelled() and chunk_wait.result()
    woken_by_events = event_wait.done() and not event_wait.cancelled() and event_wait.result()
    return bool(woken_by_events or not woken_by_chunks)
