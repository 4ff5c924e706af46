"""Result coalescing: finished results wait a moment and go out together in one Complete.

A flush happens when ``flush_size`` results are ready or ``flush_interval`` after the
first one, whichever comes first (DESIGN.md §11: batching is the lever), or at once
when no held lease is still executing. One Complete is in flight at a time, so
results that finish meanwhile form the next batch.

A Complete whose answer is lost is sent again with the same lease tokens and the same
results (the server answers DUPLICATE for what it already recorded). Before every
send, results whose lease the worker no longer holds (revoked meanwhile) are dropped.
A Complete the server refuses (INVALID_ARGUMENT and the like, or INTERNAL again and
again) is never sent again unchanged: it is bisected until the refused result is alone,
which is then reported as a failure carrying the server's reason (issue 13: one bad
result must not wedge the others). Each result ends with one call to the owner's
``settled()``.

A Complete also claims the slots its results free, and what slots are free already
(CompleteRequest.claim_max_leases): the server settles the results and leases the next
tasks in one transaction, so a worker's cycle is one call, and a task the results made
ready (a chain's next) comes back in the answer. The leases are started (``refill``)
before the results are settled, so the claim loop, woken by the freed slots, sees them
held. Only a batch sent whole claims: the parts of a refused batch, bisected, do not
(the claim loop fills what they free).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from awp.v1 import session_pb2, worker_pb2
from awp_protocol.limits import MAX_LEASES_PER_CLAIM, MAX_RESULTS_PER_COMPLETE
from awp_worker import _tracing
from awp_worker._backoff import Backoff
from awp_worker._errors import Kind, classify, describe, server_fault, session_lost
from awp_worker._executors import failure
from awp_worker._lease import STOOD_DOWN, HeldLease, StandDown
from awp_worker._lifecycle import State
from awp_worker._logging import LeaseLog
from awp_worker._owner import Owner

log = logging.getLogger("awp_worker.complete")

# INTERNAL or UNKNOWN answers to one Complete before it is treated as refused: enough
# to ride out a broken connection (about 0.75 s with the default backoff), bounded so
# that a result the server fails on cannot hold its batch forever.
MAX_SERVER_FAULTS = 5
# How much of a refused failure's own message its replacement quotes.
REFUSED_EXCERPT_CHARS = 512

# Results are batched up to gRPC's default 4 MiB receive limit, which any proxy on the
# way accepts too; a larger result goes alone, and one result always fits the server's
# MAX_REQUEST_BYTES (awp_protocol.limits).
MAX_BYTES_PER_CALL = 3 * 1024 * 1024

# How a result ended, as the metrics and the owner name it, and what the log says:
# the server's answers...
_ANSWERS = {
    session_pb2.COMPLETE_OUTCOME_ACCEPTED: ("accepted", logging.DEBUG, "result accepted"),
    session_pb2.COMPLETE_OUTCOME_DUPLICATE: (
        "duplicate", logging.INFO, "result was already recorded (duplicate)",
    ),
    session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT: (
        "result_conflict", logging.WARNING,
        "the server holds a different result for this lease; ours dropped",
    ),
    session_pb2.COMPLETE_OUTCOME_LEASE_LOST: (
        StandDown.LEASE_LOST, logging.WARNING,
        "lease lost before the result arrived; the server discarded it",
    ),
}  # fmt: skip
UNSPECIFIED = "unspecified"
# ...and the two endings without an answer.
DROPPED = "dropped"  # the lease was revoked before the result was sent
REJECTED = "rejected"  # the server refused the result and its failure in its place


class ResultFlusher:
    def __init__(
        self,
        owner: Owner,
        *,
        flush_size: int = 16,
        flush_interval: float = 0.002,
        backoff: Callable[[], Backoff] = lambda: Backoff(0.05, 2.0),
        refill: Callable[[Sequence[worker_pb2.Lease]], None] | None = None,
    ) -> None:
        """refill: starts the leases a Complete's answer carries (None: Completes claim
        nothing); settable, as what starts leases needs the flusher."""
        self._owner = owner
        self.refill = refill
        self.flush_size = flush_size
        self.flush_interval = flush_interval
        self._new_backoff = backoff
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
        # When every held lease (executing or reporting) is already reported, no
        # further result can join the batch: waiting for flush_interval would only
        # delay it.
        return len(self._owner.leases) <= self.backlog

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
        """Send one batch until it is answered (transient errors are retried).

        A batch the server refuses is never sent again as it was: it is split in halves
        until each refused result stands alone, and that one is reported as failed
        instead (``_replace``), so the others are recorded and the task follows its
        retry rule. Every accepted part of the batch goes before any replacement
        (issue 25.5): a replacement may fail its run, which revokes the leases of
        results still waiting to be sent, and finished work would be thrown away.
        """
        refused: list[tuple[HeldLease, Exception]] = []
        await self._isolate(list(batch), refused, claim=self.refill is not None)
        for held, refusal in refused:
            await self._replace(held, refusal)

    async def _isolate(
        self,
        batch: list[HeldLease],
        refused: list[tuple[HeldLease, Exception]],
        *,
        claim: bool = False,
    ) -> None:
        """Sends batch (claiming the slots free once it is settled, if claim),
        bisecting what the server refuses; each result refused alone is added to
        refused, unsent."""
        sent = await self._send(batch, claim=claim)
        if sent is None:
            return
        todo, answer = sent
        if isinstance(answer, worker_pb2.CompleteResponse):
            if answer.leases and self.refill is not None:
                self._owner.metrics.claims.labels("leases").inc()
                self.refill(answer.leases)
            self._answered(todo, answer)
        elif len(todo) > 1:
            log.warning(
                "Complete of %d results refused (%s); splitting it to isolate the refused result",
                len(todo),
                describe(answer),
            )
            half = len(todo) // 2
            await self._isolate(todo[:half], refused)
            await self._isolate(todo[half:], refused)
        else:
            refused.append((todo[0], answer))

    async def _send(
        self, todo: list[HeldLease], *, claim: bool = False
    ) -> tuple[list[HeldLease], worker_pb2.CompleteResponse | Exception] | None:
        """The results still held and the server's answer, or the error by which it
        refused them; None once none of them is held any more. claim: the call also
        claims the slots free once these results are settled (while ACTIVE)."""
        backoff = self._new_backoff()
        faults = 0
        while True:
            todo = self._current(todo)
            if not todo:
                return None
            try:
                results = [held.result for held in todo if held.result]
                session = self._owner.session
                # Without a claim, the plain Complete of every client.
                response = await (
                    session.complete(results, self._wish(todo))
                    if claim
                    else session.complete(results)
                )
            except Exception as exc:
                kind = classify(exc)
                if kind is Kind.PERMANENT:
                    if not self._current(todo):
                        # A session that ended after its Drain, for results it no
                        # longer holds: nothing is lost.
                        return None
                    raise session_lost(exc) from None
                if kind is Kind.REJECTED:
                    return todo, exc
                if server_fault(exc):
                    faults += 1
                    if faults >= MAX_SERVER_FAULTS:
                        # No longer believed to be a broken connection: the server
                        # fails on these results. Resending them forever would wedge
                        # every one of them behind the bad one.
                        return todo, exc
                level = logging.WARNING if backoff.failures % 10 == 0 else logging.DEBUG
                log.log(
                    level,
                    "Complete of %d results failed (%s); sending the same results again",
                    len(todo),
                    describe(exc),
                )
                await asyncio.sleep(backoff.next())
                continue
            return todo, response

    def _wish(self, todo: list[HeldLease]) -> int:
        """The slots free once todo is settled: what this Complete claims."""
        owner = self._owner
        if owner.lifecycle.state is not State.ACTIVE:
            return 0
        free = owner.config.concurrency - len(owner.leases) + len(todo)
        return max(0, min(free, MAX_LEASES_PER_CLAIM))

    def _current(self, todo: list[HeldLease]) -> list[HeldLease]:
        current = []
        for held in todo:
            if self._owner.leases.holds(held):
                current.append(held)
            else:
                message = "lease revoked before its result was sent: dropped"
                self._settle(held, DROPPED, logging.DEBUG, message)
        return current

    def _answered(self, todo: list[HeldLease], response: worker_pb2.CompleteResponse) -> None:
        answers = {answer.dispatch_id: answer.outcome for answer in response.answers}
        for held in todo:
            outcome = answers.get(held.dispatch_id, session_pb2.COMPLETE_OUTCOME_UNSPECIFIED)
            name, level, message = _ANSWERS.get(
                outcome,
                (
                    UNSPECIFIED,
                    logging.WARNING,
                    f"the server gave no usable answer for this result ({outcome})",
                ),
            )
            self._settle(held, name, level, message)

    async def _replace(self, held: HeldLease, refusal: Exception) -> None:
        """Reports a result the server refused alone as a failure of the task that
        carries the server's reason. Refused too, the lease is given up instead."""
        held.result = _refused_result(held, describe(refusal))
        LeaseLog(log, held.log_fields).warning(
            "the server refused this result (%s); reporting it as failed instead",
            describe(refusal),
        )
        sent = await self._send([held])
        if sent is None:
            return
        todo, answer = sent
        if isinstance(answer, worker_pb2.CompleteResponse):
            self._answered(todo, answer)
            return
        self._settle(
            held,
            REJECTED,
            logging.ERROR,
            f"the server refused this result and its replacement ({describe(answer)}); "
            "giving the lease up so it is retried",
        )

    def _settle(self, held: HeldLease, outcome: str, level: int, message: str) -> None:
        self._owner.metrics.completes.labels(outcome).inc()
        # LEASE_LOST: the lease was no longer ours; the metric's label says the same.
        extra = {STOOD_DOWN: StandDown.LEASE_LOST} if outcome == StandDown.LEASE_LOST else {}
        LeaseLog(log, held.log_fields).log(level, "%s", message, extra=extra)
        _tracing.completed(held, outcome)
        self._owner.settled(held, outcome)


def _result_size(held: HeldLease) -> int:
    return held.result.ByteSize() + 16 if held.result is not None else 0


def _refused_result(held: HeldLease, refusal: str) -> worker_pb2.TaskResult:
    """A failure in place of a refused result: retryable as the action's own failure
    was (a refused success is retryable: the task's retry rule bounds it), with the
    server's reason and the start of the action's error, every character printable so
    that this report cannot be refused for the same reason."""
    original = held.result
    message = f"the server refused this task's result: {_printable(refusal)}"
    retryable = True
    if original is not None and original.outcome == worker_pb2.RESULT_OUTCOME_FAILED:
        retryable = original.error.retryable
        excerpt = _printable(original.error.message[:REFUSED_EXCERPT_CHARS])
        message += f"; the action's error began: {excerpt}"
    return failure(held.lease, message, retryable=retryable)


def _printable(text: str) -> str:
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
