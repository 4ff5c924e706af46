"""The replay core of one attempt (docs/design.md §16): the task's checkpoints, and the
order in which the action reaches its steps and waits.

An action is replayed from the top on every attempt. Each step or wait it reaches is
identified by ``(kind, name, occurrence)``: ``occurrence`` counts the earlier calls of
the same ``(kind, name)`` in this attempt (0, 1, ...), so an action that reaches them in
the same order names them the same way on every attempt. Whatever a previous attempt
stored under that key (a step's result, a satisfied wait's outcome) is replayed instead
of running the step, or waiting, again.

The interface, for ``ctx.step`` (awp_sdk.steps) and the waits alike, is four calls on
the attempt's ``Replay`` (``ctx.replay``):

    occurrence = replay.occurrence(kind, name)      # hand out the next occurrence
    stored = await replay.lookup(kind, name, occurrence)  # Checkpoint | None
    if stored is not None:
        replay.hit(stored)                          # counts it in replay.savings
        ... use stored.value / stored.timed_out ...
    else:
        ... run the step / Await through the worker's RPC, then replay.stored(new) ...

``lookup`` loads the task's checkpoints on its first call (once per attempt, by the
``CheckpointStore`` the worker supplies: LoadCheckpoints, fenced; it raises
``ActionCancelled`` once the lease is lost). ``occurrence`` and ``hit`` never block and
may be called from any thread; ``lookup`` and the store's calls are coroutines of the
worker's event loop: a sync action (in a thread) runs them with ``replay.blocking(...)``.
``savings`` is what this attempt replayed instead of running (steps, and the tokens and
cost they had reported); the worker reports it with the attempt's result (and with an
Await, since a suspended attempt reports no result).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from awp_protocol.states import CHECKPOINT_KINDS, CheckpointKind
from awp_sdk.threads import call_from_thread

if TYPE_CHECKING:
    from awp_sdk.waits import WaitSpec

T = TypeVar("T")

# What a checkpoint records: the storage names of awp.v1.CheckpointKind.
Kind = CheckpointKind
KINDS = CHECKPOINT_KINDS


@dataclass(frozen=True, slots=True)
class Usage:
    """What a step reported it cost (its model calls): tokens, and dollars (finite, not
    negative)."""

    tokens: int = 0
    cost_usd: float = 0.0

    @staticmethod
    def of(value: Mapping[str, Any]) -> Usage:
        """From ``{"tokens": int, "cost_usd": float}`` (either may be left out);
        ValueError naming what is wrong."""
        unknown = set(value) - {"tokens", "cost_usd"}
        if unknown:
            raise ValueError(
                f"a step's usage takes 'tokens' and 'cost_usd', not {', '.join(sorted(unknown))}"
            )
        tokens = value.get("tokens", 0)
        cost = value.get("cost_usd", 0.0)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens < 2**63:
            raise ValueError(f"a step's usage tokens must be an integer >= 0, got {tokens!r}")
        if (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not math.isfinite(cost)
            or cost < 0
        ):
            raise ValueError(f"a step's usage cost_usd must be a finite number >= 0, got {cost!r}")
        return Usage(tokens, float(cost))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A memo of the task: ``value`` is the JSON value stored (a step's result, a
    signal's payload, a decision, a sleep's wake time; None when ``timed_out``)."""

    kind: Kind
    name: str
    occurrence: int
    value: Any
    usage: Usage = Usage()
    timed_out: bool = False
    # The attempt that stored it; 0 for a wait's outcome stored while no attempt ran.
    attempt: int = 0


@dataclass(slots=True)
class Savings:
    """What an attempt replayed instead of running: steps, their tokens and cost."""

    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class CheckpointStore(Protocol):
    """The worker's side of the replay core: the task's checkpoints under the attempt's
    lease. Each raises ``ActionCancelled`` once the lease is lost (and stops the attempt)."""

    async def load(self) -> Sequence[Checkpoint]:
        """Every checkpoint of the task stored so far (all pages)."""
        ...

    async def record_step(
        self, name: str, occurrence: int, value_json: str, usage: Usage
    ) -> Checkpoint | None:
        """Stores a step's result (RecordStep): None once it is stored (ACCEPTED or
        DUPLICATE); the checkpoint stored before, if another value was (a memo never
        changes). PermanentError past a memo limit (MEMO_LIMIT)."""
        ...

    async def await_wait(self, spec: WaitSpec, replayed: Savings) -> Checkpoint | None:
        """Reaches a wait (Await; awp_sdk.waits): its checkpoint when it is satisfied now,
        None when the attempt ended SUSPENDED (the attempt is stopped). ``replayed`` is
        what the attempt replayed so far, reported since a suspended one sends no result."""
        ...


class Replay:
    """The checkpoints of one attempt, and the occurrences handed out so far."""

    def __init__(self, store: CheckpointStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self._loop = loop
        self._counts: dict[tuple[str, str], int] = {}
        self._checkpoints: dict[tuple[str, str, int], Checkpoint] | None = None
        self._loading: asyncio.Lock | None = None
        self._mutex = threading.Lock()
        self._savings = Savings()

    def occurrence(self, kind: Kind, name: str) -> int:
        """The occurrence of this call of ``(kind, name)``: 0 for the first, then 1..."""
        with self._mutex:
            count = self._counts.get((kind, name), 0)
            self._counts[(kind, name)] = count + 1
            return count

    async def lookup(self, kind: Kind, name: str, occurrence: int) -> Checkpoint | None:
        """The checkpoint stored for ``(kind, name, occurrence)``, if any (the task's
        checkpoints are loaded on the first call)."""
        if self._checkpoints is None:
            if self._loading is None:
                self._loading = asyncio.Lock()
            async with self._loading:
                if self._checkpoints is None:
                    loaded = await self.store.load()
                    self._checkpoints = {(c.kind, c.name, c.occurrence): c for c in loaded}
        return self._checkpoints.get((kind, name, occurrence))

    def hit(self, checkpoint: Checkpoint) -> None:
        """``checkpoint`` was replayed: a step's counts as saved, with its usage."""
        if checkpoint.kind != "step":
            return
        with self._mutex:
            self._savings.steps += 1
            self._savings.tokens += checkpoint.usage.tokens
            self._savings.cost_usd += checkpoint.usage.cost_usd

    def stored(self, checkpoint: Checkpoint) -> None:
        """``checkpoint`` was stored by this attempt (a later lookup of its key finds it)."""
        if self._checkpoints is not None:
            key = (checkpoint.kind, checkpoint.name, checkpoint.occurrence)
            self._checkpoints[key] = checkpoint

    @property
    def savings(self) -> Savings:
        with self._mutex:
            return Savings(self._savings.steps, self._savings.tokens, self._savings.cost_usd)

    def on_loop(self) -> bool:
        """Whether the caller runs on the worker's event loop (an async action)."""
        return _running_loop() is self._loop

    def blocking(self, awaitable: Awaitable[T]) -> T:
        """Runs a coroutine of this replay (or of its store) from a sync action's thread
        and returns its result; a sync call on the loop itself would deadlock, so it is
        refused."""
        if self.on_loop():
            raise RuntimeError(
                "a sync durable call from an async action would block the event loop: await it"
            )
        return call_from_thread(self._loop, awaitable)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
