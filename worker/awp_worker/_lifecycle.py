"""Where a worker session stands: one state, its allowed moves, and one way to wait.

STARTING registers; ACTIVE claims; DRAINING claims no more while held leases finish (heartbeats and
Completes go on); HANDING_BACK cancels what still runs and hands it back in the final
Drain; STOPPED is the end: nothing more is sent. Besides the state, one fact: the
server may already have stopped the session while this side drains (it then needs
no final Drain unless it has leases to hand back).

Everything the parts wait for (a state change, a freed slot, a finished task) is
announced by ``notify()``; a waiter re-checks its own condition on each one
(``wait_until``), so there is one waiting primitive instead of an event per fact.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILURE = 1  # an internal failure, or the final Drain could not be delivered
EXIT_USAGE = 2
EXIT_SESSION_LOST = 3  # permanent session/protocol error: restart and register anew


class State(enum.Enum):
    STARTING = "starting"  # registering
    ACTIVE = "active"  # claiming
    DRAINING = "draining"  # no new claims; held leases finish
    HANDING_BACK = "handing_back"  # running leases are cancelled and handed back
    STOPPED = "stopped"  # the session is over


# The allowed moves, and what makes them.
_NEXT: dict[State, frozenset[State]] = {
    # registered; a shutdown request came first; Register refused
    State.STARTING: frozenset({State.ACTIVE, State.DRAINING, State.STOPPED}),
    # a shutdown request (or the server drains the session); a part failed; session lost
    State.ACTIVE: frozenset({State.DRAINING, State.HANDING_BACK, State.STOPPED}),
    # a second request, the shutdown grace or a failure; drained, or session lost
    State.DRAINING: frozenset({State.HANDING_BACK, State.STOPPED}),
    # the final Drain was sent
    State.HANDING_BACK: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
}


class Lifecycle:
    def __init__(self) -> None:
        self._state = State.STARTING
        self.server_stopped = False
        self._changed = asyncio.Event()

    @property
    def state(self) -> State:
        return self._state

    def move(self, to: State) -> bool:
        """Go to ``to`` if the current state allows it; False (and no change) if not,
        e.g. a request the session has already gone past."""
        if to not in _NEXT[self._state]:
            return False
        self._state = to
        self.notify()
        return True

    def mark_server_stopped(self) -> None:
        self.server_stopped = True
        self.notify()

    def notify(self) -> None:
        """Wake every ``wait_until`` to re-check its condition."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, condition: Callable[[], bool], within: float | None = None) -> bool:
        """Wait until ``condition()`` holds (True) or ``within`` seconds pass (False)."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while not condition():
            changed = self._changed
            try:
                async with asyncio.timeout_at(deadline):
                    await changed.wait()
            except TimeoutError:
                return condition()
        return True

    async def while_in(self, state: State, call: Coroutine[Any, Any, T], name: str) -> T | None:
        """Run ``call`` as long as the session stays in ``state``: its result, or None
        if the state moved on first (the call is then cancelled). Its errors propagate."""
        task = asyncio.create_task(call, name=name)
        task.add_done_callback(lambda _: self.notify())
        try:
            await self.wait_until(lambda: task.done() or self._state is not state)
        finally:
            if not task.done():
                task.cancel()
                # A call stuck in gRPC may outlive this; closing the channel ends it.
                await asyncio.wait({task}, timeout=5.0)
        if not task.done() or task.cancelled():
            return None
        return task.result()
