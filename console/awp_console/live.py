"""A run's state changes, streamed to the browser as server-sent events.

One WatchRun per open run page, relayed as batches: whatever arrived while the last
batch was being sent goes out together, at most every BATCH_INTERVAL_S, so a run of
thousands of tasks costs the browser a few messages a second, not one per change. Each
batch carries the seq of its last event as its SSE id: a browser that reconnects sends
it back (Last-Event-ID) and the watch resumes after it: so the stream simply closes
when awp-server cannot be reached. When the run has ended the stream sends `end`; when
the watch is refused, `failed` with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Final

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from awp_console import api, models
from awp_console.web import caller

BATCH_INTERVAL_S: Final = 0.1
MAX_BATCH: Final = 2_000
PING_S: Final = 15
# What the browser needs of an event: [type, task key, attempt, new state].
Compact = tuple[str, str, int, str]


async def events(request: Request) -> Response:
    who = await caller(request)
    run_id = request.path_params["run_id"]
    given = request.headers.get("last-event-id") or request.query_params.get("after", "0")
    if not given.isdigit():
        raise HTTPException(400, "after (or Last-Event-ID) must be a seq, a whole number")
    return EventSourceResponse(_batches(who.api.watch_run(run_id, int(given))), ping=PING_S)


def _compact(event: models.Event) -> Compact:
    return (event.type, event.task_key, event.attempt, event.to_state)


async def _batches(stream: AsyncIterator[models.Event]) -> AsyncIterator[ServerSentEvent]:
    queue: asyncio.Queue[models.Event | api.ApiError | None] = asyncio.Queue()

    async def relay() -> None:
        try:
            async for event in stream:
                await queue.put(event)
            await queue.put(None)
        except api.ApiError as error:
            await queue.put(error)

    reader = asyncio.create_task(relay())
    try:
        while True:
            batch: list[Compact] = []
            last_seq = 0
            item = await queue.get()
            while isinstance(item, models.Event):
                batch.append(_compact(item))
                last_seq = item.seq
                if len(batch) >= MAX_BATCH or queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield ServerSentEvent(json.dumps(batch), event="events", id=str(last_seq))
            if item is None:
                yield ServerSentEvent("", event="end")
                return
            if isinstance(item, api.Unreachable):
                return  # closed without `end`: the browser reconnects and resumes
            if isinstance(item, api.ApiError):
                yield ServerSentEvent(json.dumps({"error": str(item)}), event="failed")
                return
            await asyncio.sleep(BATCH_INTERVAL_S)  # a rate, not a wait for anything
    finally:
        reader.cancel()


async def task_stream(request: Request) -> Response:
    """A task's output stream (WatchStream) as server-sent events: `chunks` (a list of
    [position, attempt, text]) whose SSE id is the last position, so a browser that
    reconnects resumes after it; `boundary` ({attempt, kind, state, error}); `end` once
    the task has ended; `failed` with the reason when the watch is refused."""
    who = await caller(request)
    run_id, key = request.path_params["run_id"], request.path_params["task_key"]
    given = request.headers.get("last-event-id")
    if given is not None and not given.isdigit():
        raise HTTPException(400, "Last-Event-ID must be a position, a whole number")
    start = int(given) + 1 if given is not None else 0
    return EventSourceResponse(
        _stream_events(who.api.watch_stream(run_id, key, start)), ping=PING_S
    )


async def _stream_events(
    pieces: AsyncIterator[models.StreamPiece],
) -> AsyncIterator[ServerSentEvent]:
    try:
        async for piece in pieces:
            if isinstance(piece, models.StreamChunks):
                last = piece.chunks[-1][0]
                yield ServerSentEvent(json.dumps(piece.chunks), event="chunks", id=str(last))
            else:
                boundary = {
                    "attempt": piece.attempt,
                    "kind": piece.kind,
                    "state": piece.state,
                    "error": piece.error_message,
                }
                yield ServerSentEvent(json.dumps(boundary), event="boundary")
    except api.Unreachable:
        return  # closed without `end`: the browser reconnects and resumes
    except api.ApiError as error:
        yield ServerSentEvent(json.dumps({"error": str(error)}), event="failed")
        return
    yield ServerSentEvent("", event="end")
