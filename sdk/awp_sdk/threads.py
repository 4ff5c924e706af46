"""Calling the worker's event loop from a sync action's thread (one home for it: the
worker's stream writes and the durable calls of awp_sdk.replay both cross here).

`asyncio.run_coroutine_threadsafe(...).result()` loses one kind of exception: a
coroutine that raises ActionCancelled (or a kind of it, e.g. a lost stream or lost
checkpoints) ends its task *cancelled*, since ActionCancelled is a CancelledError, and
the thread then sees only a bare `concurrent.futures.CancelledError` that an action's
`except ActionCancelled` misses. `call_from_thread` hands such an exception over as
itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable
from typing import TypeVar

from awp_sdk.actions import ActionCancelled

T = TypeVar("T")


def call_from_thread(loop: asyncio.AbstractEventLoop, awaitable: Awaitable[T]) -> T:
    """Runs `awaitable` on `loop`, waiting for it from another thread, and returns or
    raises what it did; ActionCancelled if the loop cancelled it (the attempt ended)."""

    async def run() -> T | ActionCancelled:
        try:
            return await awaitable
        except ActionCancelled as exc:
            return exc

    try:
        result = asyncio.run_coroutine_threadsafe(run(), loop).result()
    except concurrent.futures.CancelledError:
        raise ActionCancelled("the attempt ended during a call to the worker") from None
    if isinstance(result, ActionCancelled):
        raise result
    return result
