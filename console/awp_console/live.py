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

from awp_console import api
from awp_console.web import caller, told
from awp_sdk.records import Event
from awp_sdk.streams import StreamChunk, StreamItem

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
    return EventSourceResponse(_batches(api.watch(who.api, run_id, int(given))), ping=PING_S)


def _compact(event: Event) -> Compact:
    return (event.type, event.task_key or "", event.attempt or 0, event.to_state or "")


async def _batches(stream: AsyncIterator[Event]) -> AsyncIterator[ServerSentEvent]:
    queue: asyncio.Queue[Event | api.AwpError | None] = asyncio.Queue()

    async def relay() -> None:
        try:
            async for event in stream:
                await queue.put(event)
            await queue.put(None)
        except api.AwpError as error:
            await queue.put(error)

    reader = asyncio.create_task(relay())
    try:
        while True:
            batch: list[Compact] = []
            last_seq = 0
            item = await queue.get()
            while isinstance(item, Event):
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
            if isinstance(item, api.UNREACHABLE):
                return  # closed without `end`: the browser reconnects and resumes
            if isinstance(item, api.AwpError):
                yield ServerSentEvent(json.dumps({"error": told(item)}), event="failed")
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
        _stream_events(api.watch_stream(who.api, run_id, key, start)), ping=PING_S
    )


async def _stream_events(items: AsyncIterator[StreamItem]) -> AsyncIterator[ServerSentEvent]:
    try:
        async for item in items:
            if isinstance(item, StreamChunk):
                text = json.dumps(item.data) if item.is_json else item.data
                chunk = [[item.position, item.attempt, text]]
                yield ServerSentEvent(json.dumps(chunk), event="chunks", id=str(item.position))
            else:
                boundary = {
                    "attempt": item.attempt,
                    "kind": item.kind,
                    "state": item.state or "",
                    "error": item.error_message,
                }
                yield ServerSentEvent(json.dumps(boundary), event="boundary")
    except api.UNREACHABLE:
        return  # closed without `end`: the browser reconnects and resumes
    except api.AwpError as error:
        yield ServerSentEvent(json.dumps({"error": str(error)}), event="failed")
        return
    yield ServerSentEvent("", event="end")
