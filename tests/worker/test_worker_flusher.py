"""Result coalescing (ResultFlusher) against a recording owner: batching, retries of a
lost answer, drops, rejections, and what a permanent error does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import pytest
from test_worker_executors import make_ctx, make_lease
from test_worker_units import FakeRpcError

from awp.v1 import session_pb2, worker_pb2
from awp_protocol.errors import FieldsInvalid
from awp_protocol.results import check_result
from awp_sdk.actions import output_struct
from awp_worker._backoff import Backoff
from awp_worker._completer import DROPPED, MAX_SERVER_FAULTS, REJECTED, ResultFlusher
from awp_worker._errors import SessionLost
from awp_worker._executors import failure, success
from awp_worker._lease import HeldLease, LeaseClock, LeaseTable
from awp_worker._metrics import Metrics
from kit import poll_until as eventually


def make_held(dispatch_id: int, output: dict[str, Any] | None = None) -> HeldLease:
    lease = make_lease(dispatch_id)
    held = HeldLease(
        lease=lease, clock=LeaseClock.start(0, 15, 60, 1), ctx=make_ctx(), log_fields={}
    )
    held.result = success(lease, output_struct(output or {"i": dispatch_id}))
    return held


def make_failed(dispatch_id: int, message: str, *, retryable: bool) -> HeldLease:
    held = make_held(dispatch_id)
    held.result = failure(held.lease, message, retryable=retryable)
    return held


def as_the_server_refuses(
    code: grpc.StatusCode,
) -> Callable[[Sequence[worker_pb2.TaskResult]], Exception | None]:
    """Refuses a Complete holding a result the server's own check refuses, with `code`
    (INVALID_ARGUMENT as the server answers now, INTERNAL as it once did)."""

    def refuse(results: Sequence[worker_pb2.TaskResult]) -> Exception | None:
        try:
            for index, result in enumerate(results):
                check_result(f"results[{index}]", result)
        except FieldsInvalid as exc:
            # An INTERNAL answer comes from no handler of AWP's: it carries no reason.
            reason = "INVALID_ARGUMENT" if code == grpc.StatusCode.INVALID_ARGUMENT else ""
            return FakeRpcError(code, reason, str(exc))
        return None

    return refuse


class Recorder:
    """The flusher's owner: a real lease table, a Complete that records its calls (and
    fails as told), and a record of how each result was settled."""

    def __init__(self, *errors: Exception) -> None:
        self.calls: list[list[worker_pb2.TaskResult]] = []
        self.errors = list(errors)
        self.answers: dict[int, str] = {}
        self.dropped: list[int] = []
        self.rejected: list[int] = []
        self.while_sending: Callable[[], None] = lambda: None
        # A server's answer to what it cannot store: called with each Complete's results.
        self.refuse: Callable[[Sequence[worker_pb2.TaskResult]], Exception | None] = (
            lambda results: None
        )
        self.metrics = Metrics()
        self.leases = LeaseTable(lambda: None)
        self.session = self  # the flusher's one call: complete()

    def hold(self, dispatch_id: int, output: dict[str, Any] | None = None) -> HeldLease:
        held = make_held(dispatch_id, output)
        self.leases.add(held)
        return held

    def give_up_all(self) -> None:
        for held in self.leases:
            self.leases.release(held)

    async def complete(
        self, results: Sequence[worker_pb2.TaskResult]
    ) -> worker_pb2.CompleteResponse:
        self.calls.append(list(results))
        self.while_sending()
        if self.errors:
            raise self.errors.pop(0)
        refusal = self.refuse(results)
        if refusal is not None:
            raise refusal
        return worker_pb2.CompleteResponse(
            answers=[
                worker_pb2.CompleteAnswer(
                    dispatch_id=r.dispatch_id, outcome=session_pb2.COMPLETE_OUTCOME_ACCEPTED
                )
                for r in results
            ]
        )

    def settled(self, held: HeldLease, outcome: str) -> None:
        if outcome == DROPPED:
            self.dropped.append(held.dispatch_id)
        elif outcome == REJECTED:
            self.rejected.append(held.dispatch_id)
        else:
            self.answers[held.dispatch_id] = outcome
        self.leases.release(held)

    def flusher(self, **kw: Any) -> ResultFlusher:
        return ResultFlusher(self, **kw)


async def _run_until(flusher: ResultFlusher, done: Any, within: float = 5.0) -> None:
    task = asyncio.create_task(flusher.run())
    try:
        await eventually(done, within=within, interval=0.001)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_full_batch_flushes_without_waiting() -> None:
    recorder = Recorder()
    recorder.hold(99)  # still executing: only a full batch goes before the interval
    flusher = recorder.flusher(flush_size=16, flush_interval=30.0)
    for i in range(16):
        flusher.submit(recorder.hold(i))
    await _run_until(flusher, lambda: len(recorder.answers) == 16, within=2.0)
    assert [len(call) for call in recorder.calls] == [16]


async def test_a_partial_batch_flushes_after_the_interval() -> None:
    recorder = Recorder()
    recorder.hold(99)  # still executing: the batch waits for it, up to the interval
    flusher = recorder.flusher(flush_size=16, flush_interval=0.05)
    for i in range(3):
        flusher.submit(recorder.hold(i))
    await _run_until(flusher, lambda: len(recorder.answers) == 3)
    assert [len(call) for call in recorder.calls] == [3]


async def test_a_batch_flushes_at_once_when_no_held_lease_still_executes() -> None:
    recorder = Recorder()
    flusher = recorder.flusher(flush_size=16, flush_interval=30.0)
    for i in range(3):
        flusher.submit(recorder.hold(i))
    # Every held lease has reported: nothing can join the batch, so it goes now.
    await _run_until(flusher, lambda: len(recorder.answers) == 3, within=2.0)
    assert [len(call) for call in recorder.calls] == [3]


async def test_a_batch_waits_while_held_leases_still_execute() -> None:
    recorder = Recorder()
    recorder.hold(99)
    flusher = recorder.flusher(flush_size=16, flush_interval=0.2)
    for i in range(3):
        flusher.submit(recorder.hold(i))
    task = asyncio.create_task(flusher.run())
    try:
        await asyncio.sleep(0.05)
        assert recorder.calls == []  # the fourth lease may still finish in time
        await eventually(lambda: len(recorder.answers) == 3, within=2.0, interval=0.001)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_lost_answer_is_retried_with_the_same_results() -> None:
    recorder = Recorder(FakeRpcError(grpc.StatusCode.UNAVAILABLE), TimeoutError())
    flusher = recorder.flusher(backoff=lambda: Backoff(0.001, 0.01))
    flusher.submit(recorder.hold(1))
    flusher.submit(recorder.hold(2))
    await _run_until(flusher, lambda: len(recorder.answers) == 2)
    assert len(recorder.calls) == 3
    assert recorder.calls[0] == recorder.calls[1] == recorder.calls[2]


async def test_results_of_revoked_leases_are_dropped_before_sending() -> None:
    recorder = Recorder()
    flusher = recorder.flusher()
    revoked = recorder.hold(1)
    flusher.submit(revoked)
    flusher.submit(recorder.hold(2))
    recorder.leases.release(revoked)
    await _run_until(flusher, lambda: recorder.answers)
    assert [r.dispatch_id for r in recorder.calls[0]] == [2]
    assert recorder.dropped == [1]


async def test_a_result_refused_with_its_replacement_gives_its_lease_up() -> None:
    invalid = FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT)
    # Every Complete that holds result 1 is refused: the batch, result 1 alone, and the
    # failure reported in its place, after result 2 went through; its lease is given up.
    recorder = Recorder()
    recorder.refuse = lambda results: invalid if any(r.dispatch_id == 1 for r in results) else None
    flusher = recorder.flusher()
    flusher.submit(recorder.hold(1))
    flusher.submit(recorder.hold(2))
    await _run_until(flusher, lambda: recorder.answers and recorder.rejected)
    assert recorder.rejected == [1] and list(recorder.answers) == [2]
    assert [[r.dispatch_id for r in call] for call in recorder.calls] == [[1, 2], [1], [2], [1]]


async def test_a_permanent_error_ends_the_flusher() -> None:
    recorder = Recorder(FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    flusher = recorder.flusher()
    flusher.submit(recorder.hold(1))
    with pytest.raises(SessionLost, match="SESSION_INVALID"):
        async with asyncio.timeout(5):
            await flusher.run()


async def test_a_session_error_for_results_no_longer_held_loses_nothing() -> None:
    """The session ended (a Drain stopped it) while a Complete of leases the worker has
    since given up was on its way: nothing is lost, so the flusher does not fail."""
    recorder = Recorder(FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    flusher = recorder.flusher()
    flusher.submit(recorder.hold(1))
    recorder.while_sending = recorder.give_up_all
    task = asyncio.create_task(flusher.run())
    try:
        await eventually(lambda: recorder.dropped == [1], within=5.0, interval=0.001)
        assert not task.done()  # still serving, no SessionLost
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(recorder.calls) == 1


async def test_batches_stay_under_the_message_size_limit() -> None:
    recorder = Recorder()
    flusher = recorder.flusher(flush_size=16, flush_interval=0.01)
    for i in range(5):
        flusher.submit(recorder.hold(i, {"blob": "x" * (1024 * 1024 - 100)}))
    await _run_until(flusher, lambda: len(recorder.answers) == 5)
    assert len(recorder.calls) >= 2
    assert all(sum(r.ByteSize() for r in call) < 4 * 1024 * 1024 for call in recorder.calls)


async def test_a_refused_result_is_isolated_by_bisection_and_reported_as_failed() -> None:
    """Issue 13: one result the server refuses (a NUL in its error message) among 8.
    The batch is split until that result is alone; it is reported as a failure with
    the server's reason (retryable as the action's failure was) once the 7 others are
    recorded, and no refused Complete is ever sent again unchanged."""
    recorder = Recorder()
    recorder.refuse = as_the_server_refuses(grpc.StatusCode.INVALID_ARGUMENT)
    flusher = recorder.flusher(flush_size=8, flush_interval=30.0)
    for i in range(8):
        if i == 5:
            poison = make_failed(i, "bad\x00byte", retryable=False)
            recorder.leases.add(poison)
            flusher.submit(poison)
        else:
            flusher.submit(recorder.hold(i))
    await _run_until(flusher, lambda: len(recorder.answers) == 8)
    assert recorder.answers == dict.fromkeys(range(8), "accepted")
    assert recorder.rejected == []
    sent = [[r.dispatch_id for r in call] for call in recorder.calls]
    assert sent == [
        [0, 1, 2, 3, 4, 5, 6, 7],  # refused
        [0, 1, 2, 3],
        [4, 5, 6, 7],  # refused
        [4, 5],  # refused
        [4],
        [5],  # refused
        [6, 7],
        [5],  # the failure in its place, after every accepted part (issue 25.5)
    ]
    refused = [i for i, call in enumerate(recorder.calls) if recorder.refuse(call) is not None]
    assert refused == [0, 2, 3, 5]
    for i in refused:
        assert recorder.calls[i] not in recorder.calls[i + 1 :]
    replacement = recorder.calls[7][0]
    assert replacement.outcome == worker_pb2.RESULT_OUTCOME_FAILED
    assert "\x00" not in replacement.error.message
    assert replacement.error.message.startswith(
        "the server refused this task's result: INVALID_ARGUMENT [INVALID_ARGUMENT]: "
        "results[0].error.message: must not contain NUL characters"
    )
    assert replacement.error.message.endswith("the action's error began: bad\\x00byte")
    assert replacement.error.retryable is False


async def test_internal_answers_are_retried_a_bounded_number_of_times() -> None:
    """A server that fails on a result with INTERNAL (as one did on a NUL) gets
    MAX_SERVER_FAULTS tries per Complete, then the batch is split like a refused one."""
    recorder = Recorder()
    recorder.refuse = as_the_server_refuses(grpc.StatusCode.INTERNAL)
    flusher = recorder.flusher(backoff=lambda: Backoff(0.001, 0.01))
    flusher.submit(recorder.hold(1))
    poison = make_failed(2, "bad\x00byte", retryable=True)
    recorder.leases.add(poison)
    flusher.submit(poison)
    await _run_until(flusher, lambda: len(recorder.answers) == 2)
    sent = [[r.dispatch_id for r in call] for call in recorder.calls]
    tries = MAX_SERVER_FAULTS
    assert sent == [[1, 2]] * tries + [[1]] + [[2]] * tries + [[2]]
    replacement = recorder.calls[-1][0]
    assert replacement.outcome == worker_pb2.RESULT_OUTCOME_FAILED
    assert replacement.error.message.startswith("the server refused this task's result: INTERNAL")
    assert replacement.error.retryable is True
