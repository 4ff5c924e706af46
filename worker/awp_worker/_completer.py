"""Result coalescing: finished results wait a moment and go out together in one Complete.

A flush happens when ``flush_size`` results are ready or ``flush_interval`` after the
first one, whichever comes first (DESIGN.md §11: batching is the lever), or at once
when no held lease is still executing. One Complete is in flight at a time, so
results that finish meanwhile form the next batch.

A Complete whose answer is lost is sent again with the same lease tokens and the same
results (the server answers DUPLICATE for what it already recorded). Before every
send, results whose lease the worker no longer holds (revoked meanwhile) are dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from awp.v1 import worker_pb2
from awp_protocol.limits import MAX_RESULTS_PER_COMPLETE
from awp_worker._backoff import Backoff
from awp_worker._errors import Kind, classify, describe, session_lost
from awp_worker._lease import HeldLease

log = logging.getLogger("awp_worker.complete")

# Stay well under the server's default 4 MiB receive limit (one result may be 1 MiB).
MAX_BYTES_PER_CALL = 3 * 1024 * 1024

Send = Callable[[Sequence[worker_pb2.TaskResult]], Awaitable[worker_pb2.CompleteResponse]]


class ResultFlusher:
    def __init__(
        self,
        *,
        send: Send,
        is_current: Callable[[HeldLease], bool],
        on_answer: Callable[[HeldLease, worker_pb2.CompleteOutcome.ValueType], None],
        on_dropped: Callable[[HeldLease], None],
        on_rejected: Callable[[HeldLease, str], None],
        flush_size: int = 16,
        flush_interval: float = 0.002,
        backoff: Callable[[], Backoff] = lambda: Backoff(0.05, 2.0),
        held: Callable[[], int] | None = None,
    ) -> None:
        self._send = send
        self._is_current = is_current
        self._on_answer = on_answer
        self._on_dropped = on_dropped
        self._on_rejected = on_rejected
        self.flush_size = flush_size
        self.flush_interval = flush_interval
        self._new_backoff = backoff
        # Leases the worker holds (executing or reporting): when every one of them is
        # already reported, no further result can join the batch, so waiting for
        # flush_interval would only delay it.
        self._held = held
        self._ready: list[HeldLease] = []
        self._something = asyncio.Event()
        self._full = asyncio.Event()
        self._in_flight = 0

    def submit(self, held: HeldLease) -> None:
        if held.result is None:
            raise ValueError("a lease without a result cannot be reported")
        self._ready.append(held)
        self._something.set()
        if len(self._ready) >= self.flush_size or self._all_in():
            self._full.set()

    def _all_in(self) -> bool:
        return self._held is not None and self._held() <= self.backlog

    @property
    def backlog(self) -> int:
        """Results waiting or being sent."""
        return len(self._ready) + self._in_flight

    async def run(self) -> None:
        while True:
            await self._something.wait()
            if (
                len(self._ready) < self.flush_size
                and self.flush_interval > 0
                and not self._all_in()
            ):
                try:
                    async with asyncio.timeout(self.flush_interval):
                        await self._full.wait()
                except TimeoutError:
                    pass
            batch = self._take()
            self._in_flight = len(batch)
            try:
                await self.deliver(batch)
            finally:
                self._in_flight = 0

    def _take(self) -> list[HeldLease]:
        batch: list[HeldLease] = []
        size = 0
        while self._ready and len(batch) < MAX_RESULTS_PER_COMPLETE:
            item_size = _result_size(self._ready[0])
            if batch and size + item_size > MAX_BYTES_PER_CALL:
                break
            batch.append(self._ready.pop(0))
            size += item_size
        if not self._ready:
            self._something.clear()
        if len(self._ready) < self.flush_size:
            self._full.clear()
        return batch

    async def deliver(self, batch: Sequence[HeldLease]) -> None:
        """Send one batch until it is answered (transient errors are retried)."""
        backoff = self._new_backoff()
        todo = list(batch)
        while True:
            todo = self._current(todo)
            if not todo:
                return
            try:
                response = await self._send([held.result for held in todo if held.result])
            except Exception as exc:
                kind = classify(exc)
                if kind is Kind.PERMANENT:
                    if not self._current(todo):
                        # A session that ended after its Drain, for results it no
                        # longer holds: nothing is lost.
                        return
                    raise session_lost(exc) from None
                if kind is Kind.REJECTED:
                    await self._rejected(todo, exc)
                    return
                level = logging.WARNING if backoff.failures % 10 == 0 else logging.DEBUG
                log.log(
                    level,
                    "Complete of %d results failed (%s); sending the same results again",
                    len(todo),
                    describe(exc),
                )
                await asyncio.sleep(backoff.next())
                continue
            self._answered(todo, response)
            return

    def _current(self, todo: list[HeldLease]) -> list[HeldLease]:
        current = []
        for held in todo:
            if self._is_current(held):
                current.append(held)
            else:
                self._on_dropped(held)
        return current

    def _answered(self, todo: list[HeldLease], response: worker_pb2.CompleteResponse) -> None:
        answers = {answer.dispatch_id: answer.outcome for answer in response.answers}
        for held in todo:
            self._on_answer(
                held, answers.get(held.dispatch_id, worker_pb2.COMPLETE_OUTCOME_UNSPECIFIED)
            )

    async def _rejected(self, todo: list[HeldLease], exc: Exception) -> None:
        if len(todo) > 1:
            # One bad result must not sink the others: try them one by one.
            log.warning(
                "Complete of %d results rejected (%s); retrying them one by one",
                len(todo),
                describe(exc),
            )
            for held in todo:
                await self.deliver([held])
            return
        self._on_rejected(todo[0], describe(exc))


def _result_size(held: HeldLease) -> int:
    return held.result.ByteSize() + 16 if held.result is not None else 0
