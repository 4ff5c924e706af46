"""Side tasks under one supervisor: the first unexpected failure is recorded and
reported to ``on_failure``, so the runtime can stop the others (STYLE.md habit 7)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

log = logging.getLogger("awp_worker.supervisor")
T = TypeVar("T")


class Supervisor:
    def __init__(self, on_failure: Callable[[BaseException], None]) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_failure = on_failure
        self.failure: BaseException | None = None
        self.failed_task: str | None = None

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        if self.failure is None:
            self.failure = error
            self.failed_task = task.get_name()
            self._on_failure(error)
        else:
            log.debug("task %s also failed: %r", task.get_name(), error)

    async def cancel(self, tasks: Iterable[asyncio.Task[Any]], within: float | None = None) -> bool:
        """Cancel ``tasks`` and wait for them to end; False if some outlived ``within`` s."""
        pending = {task for task in tasks if not task.done()}
        for task in pending:
            task.cancel()
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=within)
        return not still

    async def close(self, within: float | None = None) -> bool:
        """Cancel everything still running and wait for it."""
        return await self.cancel(list(self._tasks), within)
