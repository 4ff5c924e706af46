"""Calling the worker's event loop from a sync action's thread.

`asyncio.run_coroutine_threadsafe(...).result()` loses one kind of exception: a
coroutine that raises a subclass of CancelledError (ActionCancelled and its kin, e.g. a
lost stream) ends its task *cancelled*, and the thread then sees only a bare
`concurrent.futures.CancelledError` that the action cannot tell from anything else (a
sync action catching ActionCancelled missed it). `call_from_thread` carries such an
exception across as itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def _outcome(coro: Coroutine[Any, Any, T]) -> tuple[T | None, BaseException | None]:
    try:
        return await coro, None
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the task itself was cancelled (the loop is stopping)
        return None, exc


def call_from_thread(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Runs `coro` on `loop` and waits for it from another thread, raising what it
    raised (CancelledError subclasses included)."""
    value, raised = asyncio.run_coroutine_threadsafe(_outcome(coro), loop).result()
    if raised is not None:
        raise raised
    return value  # type: ignore[return-value]
