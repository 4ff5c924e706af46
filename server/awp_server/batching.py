"""Coalescing concurrent Complete calls into shared transactions (DESIGN.md §11).

Every Complete of a run takes that run's row lock and bumps its revision, so the
completes of one busy run are serialised by PostgreSQL anyway. Here calls that arrive
while the server's transactions are busy wait for the next one, which writes all of
them together: one run lock, one revision bump, one set of statements and one commit
for many workers' results. An idle server starts a call's transaction at once, so
coalescing adds no latency; it only grows batches when calls would have queued on the
run lock.

Each result is judged exactly as on its own, against its own session
(`leases.complete_many`). If a shared transaction fails, each call is retried in a
transaction of its own, so one call's bad data or invalid session never fails another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from awp_db import leases
from awp_db.connect import Pool
from awp_kernel.errors import AwpError
from awp_kernel.fencing import ResultVerdict

log = logging.getLogger("awp.server.batching")

# Transactions writing results at once. Two: the next batch forms and starts while the
# previous one commits; more would only queue on the same run locks.
LANES = 2


@dataclass(slots=True)
class _Call:
    completion: leases.Completion
    answer: asyncio.Future[list[ResultVerdict]]
    ids: frozenset[int] = field(default_factory=frozenset)


class CompleteBatcher:
    def __init__(self, pool: Pool, *, max_results: int, lanes: int = LANES) -> None:
        self._pool = pool
        self._max_results = max_results
        self._lanes = lanes
        self._queue: list[_Call] = []
        self._busy = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # transactions run (for tests and metrics)

    async def complete(
        self, worker_id: str, session_token: str, results: Sequence[leases.ResultIn]
    ) -> list[ResultVerdict]:
        """The verdicts of one call's results, written in some shared transaction."""
        call = _Call(
            leases.Completion(worker_id, session_token, results),
            asyncio.get_running_loop().create_future(),
            frozenset(r.dispatch_id for r in results),
        )
        # Retrieved even when nobody awaits it any more (the caller went away).
        call.answer.add_done_callback(_retrieve)
        self._queue.append(call)
        self._start()
        # If the caller goes away, its results are still written (or not) with the
        # batch; the worker's retry of the same results is then answered DUPLICATE.
        return await asyncio.shield(call.answer)

    def _start(self) -> None:
        while self._busy < self._lanes and self._queue:
            batch = self._take()
            self._busy += 1
            task = asyncio.create_task(self._write(batch), name="awp-complete-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Call]:
        """Queued calls in arrival order, up to max_results, no dispatch twice."""
        batch: list[_Call] = []
        left: list[_Call] = []
        seen: set[int] = set()
        size = 0
        for call in self._queue:
            count = len(call.completion.results)
            if batch and (size + count > self._max_results or call.ids & seen):
                left.append(call)
                continue
            batch.append(call)
            seen |= call.ids
            size += count
        self._queue = left
        return batch

    async def _write(self, batch: list[_Call]) -> None:
        try:
            self.batches += 1
            try:
                outcomes = await self._transaction(batch)
            except Exception as exc:
                if len(batch) == 1:
                    _settle(batch[0], exc)
                    return
                log.warning(
                    "a shared Complete transaction failed; writing its calls one by one",
                    extra={"calls": len(batch), "error": repr(exc)},
                )
                for call in batch:
                    try:
                        (outcome,) = await self._transaction([call])
                    except Exception as single:
                        _settle(call, single)
                    else:
                        _settle(call, outcome)
                return
            for call, outcome in zip(batch, outcomes, strict=True):
                _settle(call, outcome)
        except BaseException as exc:
            for call in batch:
                if not call.answer.done():
                    call.answer.set_exception(exc)
            raise
        finally:
            self._busy -= 1
            self._start()

    async def _transaction(self, batch: list[_Call]) -> list[list[ResultVerdict] | AwpError]:
        async with self._pool.acquire() as conn:
            return await leases.complete_many(conn, [call.completion for call in batch])

    async def close(self) -> None:
        """Waits for the transactions in progress (calls still queued are started)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _settle(call: _Call, outcome: list[ResultVerdict] | BaseException) -> None:
    if call.answer.done():
        return
    if isinstance(outcome, BaseException):
        call.answer.set_exception(outcome)
    else:
        call.answer.set_result(outcome)


def _retrieve(answer: asyncio.Future[list[ResultVerdict]]) -> None:
    if not answer.cancelled():
        answer.exception()
