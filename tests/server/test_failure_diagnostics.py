"""What a failed attempt keeps (TaskError type, traceback, log tail): sent with Complete,
refused beyond its bounds, stored on the attempt, shown by GetRun (the failed task's
traceback) and ListAttempts (everything, in pages), over one in-process awp-server."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import grpc
import pytest

from awp.v1 import control_pb2_grpc, runs_pb2, session_pb2, types_pb2, worker_pb2
from awp_db.connect import Pool
from awp_protocol.limits import (
    MAX_ATTEMPTS_PAGE_SIZE,
    MAX_ERROR_TYPE_CHARS,
    MAX_LOG_TAIL_CHARS,
    MAX_TRACEBACK_CHARS,
)
from kit import ADMIN, expect_error, spec, start_run
from kit.db import dispatch_all
from kit.rawworker import RawWorker, register

INVALID = grpc.StatusCode.INVALID_ARGUMENT
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/actions.py", line 12, in build\n'
    '    return data["missing"]\n'
    "KeyError: 'missing'\n"
)


def failed(lease: worker_pb2.Lease, **error: Any) -> worker_pb2.TaskResult:
    fields = {"message": "KeyError: 'missing'", "retryable": False, **error}
    return worker_pb2.TaskResult(
        dispatch_id=lease.dispatch_id,
        lease_token=lease.lease_token,
        outcome=worker_pb2.RESULT_OUTCOME_FAILED,
        error=types_pb2.TaskError(**fields),
    )


async def report(worker: RawWorker, result: worker_pb2.TaskResult) -> int:
    answer = await worker.stub.Complete(
        worker_pb2.CompleteRequest(session=worker.session, results=[result]), timeout=10
    )
    outcome: int = answer.answers[0].outcome
    return outcome


async def test_a_failure_keeps_its_type_traceback_and_log_tail(
    stubs: tuple[Any, control_pb2_grpc.ControlServiceStub], pool: Pool
) -> None:
    worker_stub, control = stubs
    run_id = await start_run(pool, spec("wf", 2, chain=True, max_attempts=1))
    worker = await register(worker_stub)
    await dispatch_all(pool)
    [lease] = await worker.claim()
    result = failed(lease, type="KeyError", traceback=TRACEBACK, log_tail="12:00:01 INFO start")
    assert await report(worker, result) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    # The same report again is a duplicate; another traceback is another result.
    assert await report(worker, result) == session_pb2.COMPLETE_OUTCOME_DUPLICATE
    other = failed(lease, type="KeyError", traceback=TRACEBACK + " ")
    assert await report(worker, other) == session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT

    got = await control.GetRun(runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=ADMIN)
    t0 = got.tasks[0]
    assert t0.state == types_pb2.TASK_STATE_FAILED
    assert (t0.error.type, t0.error.message, t0.error.traceback) == (
        "KeyError",
        "KeyError: 'missing'",
        TRACEBACK,
    )
    assert t0.error.log_tail == ""  # ListAttempts' alone
    [attempt] = got.attempts
    assert (attempt.error.type, attempt.error.traceback, attempt.error.log_tail) == (
        "KeyError",
        "",
        "",
    )

    listed = await control.ListAttempts(
        runs_pb2.ListAttemptsRequest(run_id=str(run_id)), metadata=ADMIN
    )
    [detail] = listed.attempts
    assert detail.worker_name == "test-worker" and detail.worker_id == worker.session.worker_id
    assert detail.error == types_pb2.TaskError(
        message="KeyError: 'missing'",
        retryable=False,
        type="KeyError",
        traceback=TRACEBACK,
        log_tail="12:00:01 INFO start",
    )
    assert not listed.next_page_token
    # Events stay small: the error's type and message, not its traceback.
    payloads = await pool.fetch(
        "SELECT payload FROM state_events WHERE run_id = $1 AND payload ? 'error'", run_id
    )
    assert [p["payload"]["error"] for p in payloads] == [
        {"message": "KeyError: 'missing'", "retryable": False, "type": "KeyError"}
    ]


async def test_a_failure_without_diagnostics_is_still_understood(
    stubs: tuple[Any, control_pb2_grpc.ControlServiceStub], pool: Pool
) -> None:
    worker_stub, control = stubs
    run_id = await start_run(pool, spec("wf", max_attempts=1))
    worker = await register(worker_stub)
    await dispatch_all(pool)
    [lease] = await worker.claim()
    assert await worker.fail(lease, "boom", False) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    got = await control.GetRun(runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=ADMIN)
    assert got.tasks[0].error == types_pb2.TaskError(message="boom", retryable=False)
    row = await pool.fetchrow("SELECT error, traceback, log_tail FROM attempts")
    assert dict(row) == {
        "error": {"message": "boom", "retryable": False},
        "traceback": None,
        "log_tail": None,
    }


@pytest.mark.parametrize(
    ("error", "field"),
    [
        ({"traceback": "x" * (MAX_TRACEBACK_CHARS + 1)}, "results[0].error.traceback"),
        ({"log_tail": "x" * (MAX_LOG_TAIL_CHARS + 1)}, "results[0].error.log_tail"),
        ({"type": "E" * (MAX_ERROR_TYPE_CHARS + 1)}, "results[0].error.type"),
        ({"log_tail": "bad \x00 byte"}, "results[0].error.log_tail"),
        ({"traceback": "bad \x00 byte"}, "results[0].error.traceback"),
    ],
    ids=["long-traceback", "long-log-tail", "long-type", "nul-log-tail", "nul-traceback"],
)
async def test_diagnostics_beyond_their_bounds_are_refused_and_nothing_is_recorded(
    stubs: tuple[Any, Any], pool: Pool, error: dict[str, str], field: str
) -> None:
    worker_stub, _ = stubs
    await start_run(pool, spec("wf"))
    worker = await register(worker_stub)
    await dispatch_all(pool)
    [lease] = await worker.claim()
    refused = await expect_error(
        worker_stub.Complete(
            worker_pb2.CompleteRequest(session=worker.session, results=[failed(lease, **error)])
        )
    )
    assert (refused.code, refused.fields) == (INVALID, [field]), refused
    assert await pool.fetchval("SELECT state FROM attempts") == "running"
    # At the bound exactly, accepted.
    at_bound = {name: value[: len(value) - 1].replace("\x00", "0") for name, value in error.items()}
    assert await report(worker, failed(lease, **at_bound)) == session_pb2.COMPLETE_OUTCOME_ACCEPTED


async def test_list_attempts_pages_filters_and_names_bad_requests(
    stubs: tuple[Any, control_pb2_grpc.ControlServiceStub], pool: Pool
) -> None:
    worker_stub, control = stubs
    tasks = MAX_ATTEMPTS_PAGE_SIZE + 5
    run_id = await start_run(pool, spec("wf", tasks))
    worker = await register(worker_stub, concurrency=tasks)
    await dispatch_all(pool)
    leases = await worker.claim(tasks)
    for lease in leases:
        assert await worker.fail(lease, f"{lease.task_key} failed", True) == 1

    def request(**fields: Any) -> runs_pb2.ListAttemptsRequest:
        return runs_pb2.ListAttemptsRequest(run_id=str(run_id), **fields)

    first = await control.ListAttempts(request(), metadata=ADMIN)
    assert len(first.attempts) == MAX_ATTEMPTS_PAGE_SIZE and first.next_page_token
    # Asking for more than the page bound gets the bound, not a refusal.
    big = await control.ListAttempts(request(page_size=1000), metadata=ADMIN)
    assert len(big.attempts) == MAX_ATTEMPTS_PAGE_SIZE
    rest = await control.ListAttempts(request(page_token=first.next_page_token), metadata=ADMIN)
    assert len(rest.attempts) == 5 and not rest.next_page_token
    seen = [a.dispatch_id for a in [*first.attempts, *rest.attempts]]
    assert seen == sorted(lease.dispatch_id for lease in leases)  # oldest first, each once

    one = await control.ListAttempts(request(task_key="t7"), metadata=ADMIN)
    assert [(a.task_key, a.error.message) for a in one.attempts] == [("t7", "t7 failed")]

    for bad, field in (
        (request(task_key="nope"), "task_key"),
        (request(page_token="garbage"), "page_token"),
        (runs_pb2.ListAttemptsRequest(run_id="not-a-uuid"), "run_id"),
    ):
        error = await expect_error(control.ListAttempts(bad, metadata=ADMIN))
        assert (error.code, error.fields) == (INVALID, [field]), error
    missing = await expect_error(
        control.ListAttempts(runs_pb2.ListAttemptsRequest(run_id=str(UUID(int=3))), metadata=ADMIN)
    )
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND")
