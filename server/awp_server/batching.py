"""Coalescing concurrent Claim and Complete calls, and heartbeats, into shared
transactions (DESIGN.md §11).

Every Claim and every Complete of a run takes that run's row lock and bumps its
revision, so the calls of one busy run are serialised by PostgreSQL anyway. Here calls
that arrive while the server's transaction of their kind is busy wait for the next
one, which serves all of them together: one run lock, one revision bump, one set of
statements and one commit for many workers. An idle server starts a call's transaction
in the same event-loop turn, so coalescing adds no latency; batches only grow when
calls would have queued on the run lock anyway. (Calls woken together, e.g. parked
Claims by one notification, form one batch instead of a queue on the run lock.)

Each call is served exactly as on its own, against its own session
(`claims.claim_many`, `leases.complete_many`). If a shared transaction fails, each
call is retried in a transaction of its own, so one call's bad data or session never
fails another.

No transaction can hold a server up (DESIGN.md §6). One that runs longer than
`SessionLimits.straggler_s` (it waits for a lock some stalled process holds, or for a
database it cannot reach) stops counting as the kind's lane: the next batch starts on
another connection, up to SPARE_LANES such stragglers. One that reaches its deadline
(`SessionLimits.transaction_s`) loses its connection, so PostgreSQL rolls it back, and
its calls are answered UNAVAILABLE like any other database failure: workers retry them,
a Complete already written is then answered DUPLICATE, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from uuid import UUID

from awp_db import claims, cycles, leases, workers
from awp_db.connect import DEFAULT_LIMITS, Conn, Pool, SessionLimits
from awp_kernel.errors import AwpError
from awp_kernel.fencing import ResultVerdict
from awp_server.errors import DATABASE_DOWN

log = logging.getLogger("awp.server.batching")

# Transactions of one kind (Claim, Complete) at once per server. One: a second
# transaction would mostly wait for the same run locks, and every call that arrives
# meanwhile joins the next batch instead (measured: single_run with 4 workers and
# many_runs both ~20-35% faster than with two).
LANES = 1
# Transactions of one kind that may straggle past their lane at once: bounds the pool
# connections a stuck database ties up (two kinds: 10 of the default 20).
SPARE_LANES = 4
# Heartbeats recorded by one statement at most (5,000 sessions at the default 5 s
# interval send 1,000 a second).
MAX_HEARTBEATS_PER_WRITE = 1000

C = TypeVar("C")  # one call
R = TypeVar("R")  # its answer


@dataclass(slots=True)
class _Pending(Generic[C, R]):
    call: C
    answer: asyncio.Future[R]
    size: int
    ids: frozenset[int]
    # The caller stopped waiting (an answer served even so: serve_abandoned).
    departed: bool = False


@dataclass(slots=True)
class _Lane:
    straggling: bool = False


class _Batcher(Generic[C, R]):
    kind = "call"
    # Serve a call whose caller went away (Complete: its results are still written).
    serve_abandoned = True
    # How long the first call of an idle batcher waits for others to join it: 0 starts
    # its transaction in the same event-loop turn (no latency added).
    linger_s = 0.0

    def __init__(
        self,
        pool: Pool,
        *,
        max_size: int,
        lanes: int = LANES,
        limits: SessionLimits = DEFAULT_LIMITS,
    ) -> None:
        self._pool = pool
        self._max_size = max_size
        self._lanes = lanes
        self._limits = limits
        self._queue: list[_Pending[C, R]] = []
        self._busy = 0  # transactions within their lane
        self._stragglers = 0  # transactions past straggler_s, not yet at their deadline
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # transactions run (for tests)
        self.straggled = 0  # transactions that gave up their lane (for tests)
        self.abandoned = 0  # transactions given up at their deadline (for tests)

    async def _submit(self, call: C, size: int, ids: frozenset[int] = frozenset()) -> R:
        loop = asyncio.get_running_loop()
        pending = _Pending[C, R](call, loop.create_future(), size, ids)
        # Retrieved even when nobody awaits it any more (the caller went away).
        pending.answer.add_done_callback(_retrieve)
        self._queue.append(pending)
        self._schedule()
        if self.serve_abandoned:
            try:
                return await asyncio.shield(pending.answer)
            except asyncio.CancelledError:
                pending.departed = True
                raise
        # Cancelling the caller cancels the answer: the batch then leaves the call out.
        return await pending.answer

    def _schedule(self) -> None:
        """Starts the queued calls at the end of this loop turn (or after the linger):
        calls woken together batch together."""
        if self._scheduled:
            return
        self._scheduled = True
        loop = asyncio.get_running_loop()
        if self.linger_s:
            loop.call_later(self.linger_s, self._start)
        else:
            loop.call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        while (
            self._queue
            and self._busy < self._lanes
            and self._stragglers + self._busy < self._lanes + SPARE_LANES
        ):
            batch = self._take()
            self._busy += 1
            task = asyncio.create_task(self._serve(batch), name=f"awp-{self.kind}-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Pending[C, R]]:
        """Queued calls in arrival order, up to max_size, no item (dispatch) twice."""
        batch: list[_Pending[C, R]] = []
        left: list[_Pending[C, R]] = []
        seen: set[int] = set()
        size = 0
        for pending in self._queue:
            if pending.answer.done():  # the caller went away before its turn
                continue
            if batch and (size + pending.size > self._max_size or pending.ids & seen):
                left.append(pending)
                continue
            batch.append(pending)
            seen |= pending.ids
            size += pending.size
        self._queue = left
        return batch

    async def _serve(self, batch: list[_Pending[C, R]]) -> None:
        lane = _Lane()
        try:
            self.batches += 1
            try:
                outcomes = await self._bounded(batch, lane)
            except Exception as exc:
                # Unavailable is no one call's fault: one by one would only wait longer.
                if len(batch) == 1 or isinstance(exc, DATABASE_DOWN):
                    for pending in batch:
                        _settle(pending, exc)
                    return
                log.warning(
                    "a shared %s transaction failed; serving its calls one by one",
                    self.kind,
                    extra={"calls": len(batch), "error": repr(exc)},
                )
                for pending in batch:
                    try:
                        (outcome,) = await self._bounded([pending], lane)
                    except Exception as single:
                        _settle(pending, single)
                    else:
                        _settle(pending, outcome)
                return
            for pending, outcome in zip(batch, outcomes, strict=True):
                _settle(pending, outcome)
        except BaseException as exc:
            for pending in batch:
                if not pending.answer.done():
                    pending.answer.set_exception(exc)
            raise
        finally:
            if lane.straggling:
                self._stragglers -= 1
            else:
                self._busy -= 1
            if self.linger_s:
                # Calls that queued meanwhile wait out a window too, or a steady
                # trickle would make every transaction a small one.
                if self._queue:
                    self._schedule()
            else:
                self._start()

    async def _bounded(self, batch: list[_Pending[C, R]], lane: _Lane) -> Sequence[R | AwpError]:
        """The batch's transaction, on a connection of its own, within its deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.transaction_s
        conn = await self._pool.acquire(timeout=self._limits.transaction_s)
        # A task of its own: cancelling a query waits for the server to answer the
        # cancel, which a stalled or unreachable server never does.
        work = asyncio.create_task(self._transaction(conn, batch))
        work.add_done_callback(_retrieve)
        try:
            done, _ = await asyncio.wait({work}, timeout=self._limits.straggler_s)
            if not done:
                self._straggle(lane)
                done, _ = await asyncio.wait({work}, timeout=max(0.0, deadline - loop.time()))
            if done:
                return work.result()
            self.abandoned += 1
            log.warning(
                "a %s transaction passed its deadline; its calls are answered UNAVAILABLE",
                self.kind,
                extra={"calls": len(batch), "deadline_s": self._limits.transaction_s},
            )
            raise TimeoutError(f"{self.kind} transaction deadline")
        finally:
            if not work.done():
                # Past the deadline (or this task cancelled): the work must not outlive
                # its connection's return to the pool. Closing the socket ends it at
                # once; PostgreSQL rolls it back.
                conn.terminate()
                await asyncio.wait({work})
            await self._pool.release(conn)

    def _straggle(self, lane: _Lane) -> None:
        """The lane's transaction is slow: the next batch need not wait for it."""
        if not lane.straggling:
            lane.straggling = True
            self.straggled += 1
            self._busy -= 1
            self._stragglers += 1
            self._start()

    async def _transaction(self, conn: Conn, batch: list[_Pending[C, R]]) -> Sequence[R | AwpError]:
        raise NotImplementedError

    async def close(self) -> None:
        """Waits for the transactions in progress (calls still queued are started)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class CompleteBatcher(_Batcher[cycles.CycleCall, cycles.CycleAnswer]):
    kind = "Complete"

    def __init__(
        self,
        pool: Pool,
        *,
        max_size: int,
        lease_ttl_ms: int | None = None,
        lanes: int = LANES,
        limits: SessionLimits = DEFAULT_LIMITS,
        grant: bool = True,
    ):
        """lease_ttl_ms: the TTL of the leases its calls claim (None: it serves no claim)."""
        super().__init__(pool, max_size=max_size, lanes=lanes, limits=limits)
        self._lease_ttl_ms = lease_ttl_ms
        self._grant = grant

    async def complete(
        self, worker_id: str, session_token: str, results: Sequence[leases.ResultIn]
    ) -> list[ResultVerdict]:
        """The verdicts of one call's results, written in some shared transaction.

        A caller that went away still has its results written (or not) with the batch;
        the worker's retry of the same results is then answered DUPLICATE.
        """
        return (await self.cycle(worker_id, session_token, results)).verdicts

    async def cycle(
        self,
        worker_id: str,
        session_token: str,
        results: Sequence[leases.ResultIn],
        claim_max_leases: int = 0,
    ) -> cycles.CycleAnswer:
        """complete's verdicts, and the leases claimed in the same transaction for up to
        claim_max_leases slots (awp_db.cycles). A caller that went away is never issued
        leases: the batch is rolled back and served again without its claim (its
        results are still written)."""
        if claim_max_leases and self._lease_ttl_ms is None:
            raise ValueError("this CompleteBatcher serves no claim (no lease_ttl_ms)")
        return await self._submit(
            cycles.CycleCall(
                leases.Completion(worker_id, session_token, results), claim_max_leases
            ),
            len(results),
            frozenset(r.dispatch_id for r in results),
        )

    async def _transaction(
        self, conn: Conn, batch: list[_Pending[cycles.CycleCall, cycles.CycleAnswer]]
    ) -> Sequence[cycles.CycleAnswer | AwpError]:
        if self._lease_ttl_ms is not None and any(p.call.claim_max_leases for p in batch):
            return await cycles.complete_and_claim_many(
                conn,
                [p.call for p in batch],
                self._lease_ttl_ms,
                still_wanted=lambda index: not batch[index].departed,
                grant=self._grant,
            )
        outcomes = await leases.complete_many(conn, [p.call.completion for p in batch])
        return [o if isinstance(o, AwpError) else cycles.CycleAnswer(o, []) for o in outcomes]


class ClaimBatcher(_Batcher[claims.ClaimCall, list[claims.IssuedLease]]):
    kind = "Claim"
    serve_abandoned = False

    def __init__(
        self,
        pool: Pool,
        *,
        max_size: int,
        lease_ttl_ms: int,
        lanes: int = LANES,
        limits: SessionLimits = DEFAULT_LIMITS,
        grant: bool = True,
    ):
        super().__init__(pool, max_size=max_size, lanes=lanes, limits=limits)
        self._lease_ttl_ms = lease_ttl_ms
        self._grant = grant

    async def claim(
        self, worker_id: str, session_token: str, max_leases: int
    ) -> list[claims.IssuedLease]:
        """Up to max_leases leases for one call, issued in some shared transaction.

        Leases are never issued to a caller that went away (cancelled) before the
        transaction commits: the batch is rolled back and served again without it.
        """
        return await self._submit(
            claims.ClaimCall(worker_id, session_token, max_leases), max_leases
        )

    async def _transaction(
        self, conn: Conn, batch: list[_Pending[claims.ClaimCall, list[claims.IssuedLease]]]
    ) -> Sequence[list[claims.IssuedLease] | AwpError]:
        try:
            return await claims.claim_many(
                conn,
                [p.call for p in batch],
                self._lease_ttl_ms,
                still_wanted=lambda index: not batch[index].answer.done(),
                grant=self._grant,
            )
        except claims.ClaimAbandoned:
            # Every caller went away: none is left to answer.
            return [[] for _ in batch]


class TouchBatcher(_Batcher[UUID, str | None]):
    """Heartbeats of all the sessions this server serves, recorded together: one
    statement and one commit for the heartbeats of a short window, so the writes of
    idle sessions grow slower than their number (docs/performance.md, "Idle workers")."""

    kind = "heartbeat"
    # Heartbeats arrive spread out (each session's every 5 s), so without a window
    # nearly every one would be a statement and a commit of its own (measured: 224
    # commits/s for 1,000 sessions). A heartbeat's answer waits this long at most, a
    # hundredth of the default interval; the writes then stay near one per window.
    linger_s = 0.05

    async def touch(self, worker_id: UUID) -> str | None:
        """The session's state once its heartbeat is recorded; None if it is no longer
        live."""
        return await self._submit(worker_id, 1)

    async def _transaction(
        self, conn: Conn, batch: list[_Pending[UUID, str | None]]
    ) -> Sequence[str | None]:
        states = await workers.touch(conn, [p.call for p in batch])
        return [states.get(p.call) for p in batch]


def _settle(pending: _Pending[C, R], outcome: R | AwpError | BaseException) -> None:
    if pending.answer.done():
        return
    if isinstance(outcome, BaseException):
        pending.answer.set_exception(outcome)
    else:
        pending.answer.set_result(outcome)


def _retrieve(answer: asyncio.Future[R]) -> None:
    if not answer.cancelled():
        answer.exception()
