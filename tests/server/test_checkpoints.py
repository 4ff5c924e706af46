"""Step checkpoints over real gRPC and PostgreSQL: RecordStep fenced exactly as Complete
(a stale, forged or finished lease stores nothing), a memo never changes, the memo
limits refused naming them, LoadCheckpoints paged, and what a Complete says it replayed
added to the task's savings in GetRun (docs/design.md §16)."""

from __future__ import annotations

import json

import grpc

from awp.v1 import checkpoints_pb2, runs_pb2, session_pb2, types_pb2, worker_pb2
from awp_db.connect import Pool
from awp_protocol.limits import MAX_CHECKPOINT_PAGE_BYTES, MAX_MEMO_BYTES, MAX_MEMOS_PER_TASK
from kit import ADMIN, Stubs, expect_error, spec
from kit.invariants import check_committed
from kit.rawworker import RawWorker, leased

OK = session_pb2.COMPLETE_OUTCOME_ACCEPTED


async def record(
    worker: RawWorker,
    lease: worker_pb2.Lease,
    name: str,
    occurrence: int,
    value: object,
    *,
    tokens: int = 0,
    token: str = "",
    value_json: str | None = None,
) -> int:
    response: checkpoints_pb2.RecordStepResponse = await worker.stub.RecordStep(
        checkpoints_pb2.RecordStepRequest(
            session=worker.session,
            dispatch_id=lease.dispatch_id,
            lease_token=token or lease.lease_token,
            name=name,
            occurrence=occurrence,
            value_json=json.dumps(value) if value_json is None else value_json,
            usage=types_pb2.StepUsage(tokens=tokens),
        ),
        timeout=30,
    )
    return response.outcome


async def load(
    worker: RawWorker, lease: worker_pb2.Lease
) -> list[list[checkpoints_pb2.Checkpoint]]:
    pages: list[list[checkpoints_pb2.Checkpoint]] = []
    token = ""
    while True:
        response: checkpoints_pb2.LoadCheckpointsResponse = await worker.stub.LoadCheckpoints(
            checkpoints_pb2.LoadCheckpointsRequest(
                session=worker.session,
                dispatch_id=lease.dispatch_id,
                lease_token=lease.lease_token,
                page_token=token,
            ),
            timeout=30,
        )
        pages.append(list(response.checkpoints))
        token = response.next_page_token
        if not token:
            return pages


async def test_a_memo_is_stored_once_and_never_changes(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    assert await record(worker, lease, "call", 0, {"b": 1, "a": [1, 2]}, tokens=7) == OK
    # The same value again (an answer lost and resent), whatever its key order: DUPLICATE.
    resent = await record(worker, lease, "call", 0, None, value_json='{"a":[1,2],"b":1}')
    assert resent == session_pb2.COMPLETE_OUTCOME_DUPLICATE
    changed = await record(worker, lease, "call", 0, {"a": "other"})
    assert changed == session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT
    assert await record(worker, lease, "call", 1, "second") == OK
    ((first, second),) = await load(worker, lease)
    assert (first.kind, first.name, first.occurrence) == (types_pb2.CHECKPOINT_KIND_STEP, "call", 0)
    assert json.loads(first.value_json) == {"a": [1, 2], "b": 1}
    assert (first.usage.tokens, first.attempt) == (7, 1)
    assert (second.occurrence, json.loads(second.value_json)) == (1, "second")
    await check_committed(pool)


async def test_a_memo_without_the_live_lease_is_lost_and_stores_nothing(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease, other) = await leased(stub, pool, spec(tasks=2), 2)
    lost = session_pb2.COMPLETE_OUTCOME_LEASE_LOST
    assert await record(worker, lease, "s", 0, 1, token=other.lease_token) == lost
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE id = $1",
        lease.dispatch_id,
    )
    assert await record(worker, lease, "s", 0, 1) == lost
    refused = await expect_error(load(worker, lease))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
    assert await worker.complete(other) == OK
    assert await record(worker, other, "late", 0, 1) == lost
    assert await pool.fetchval("SELECT count(*) FROM checkpoints") == 0


async def test_memo_limits_are_refused_naming_them(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    big = await expect_error(record(worker, lease, "big", 0, "x" * MAX_MEMO_BYTES))
    assert (big.code, big.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "MEMO_LIMIT")
    assert "memo size limit" in big.message
    bad = await expect_error(record(worker, lease, "bad name", 0, 1))
    assert (bad.code, bad.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["name"])
    not_json = await expect_error(record(worker, lease, "nan", 0, None, value_json="NaN"))
    assert (not_json.code, not_json.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["value_json"])
    # The task's bytes: memos stored by earlier attempts count (made here directly).
    await _store(pool, lease, 63, MAX_MEMO_BYTES)
    assert await record(worker, lease, "fits", 0, "x" * (MAX_MEMO_BYTES - 1000)) == OK
    over = await expect_error(record(worker, lease, "over", 0, "y" * 2000))
    assert over.reason == "MEMO_LIMIT" and "bytes-per-task limit" in over.message
    # And their number.
    await pool.execute("DELETE FROM checkpoints")
    await _store(pool, lease, MAX_MEMOS_PER_TASK, 1)
    many = await expect_error(record(worker, lease, "one-more", 0, 1))
    assert many.reason == "MEMO_LIMIT" and "memos-per-task limit" in many.message
    # A resend of a stored memo is still a DUPLICATE at the limit.
    assert await record(worker, lease, "old", 0, 0) == session_pb2.COMPLETE_OUTCOME_DUPLICATE


async def _store(pool: Pool, lease: worker_pb2.Lease, count: int, value_bytes: int) -> None:
    """count memos 'old'#0.. of the lease's task, each counted as value_bytes bytes."""
    await pool.execute(
        """INSERT INTO checkpoints (task_id, run_id, kind, name, occurrence, value, value_bytes,
                                    dispatch_id, attempt, fencing_token, recorded_at)
           SELECT a.task_id, a.run_id, 'step', 'old', n, '0', $3, a.dispatch_id, a.attempt,
                  a.fencing_token, a.started_at
             FROM attempts a, generate_series(0, $2 - 1) AS n
            WHERE a.dispatch_id = $1""",
        lease.dispatch_id,
        count,
        value_bytes,
    )


async def test_checkpoints_load_in_pages_in_key_order(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    size = MAX_MEMO_BYTES - 10
    for occurrence in range(12):
        value = str(occurrence) * size if occurrence < 10 else f"small-{occurrence}"
        assert await record(worker, lease, "page", occurrence, value[:size]) == OK
    pages = await load(worker, lease)
    assert len(pages) > 1
    assert all(sum(len(c.value_json) for c in page) <= MAX_CHECKPOINT_PAGE_BYTES for page in pages)
    assert [c.occurrence for page in pages for c in page] == list(range(12))


async def test_what_a_result_replayed_adds_to_its_tasks_savings(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    replayed = types_pb2.MemoSavings(steps=2, tokens=1500, cost_usd=0.25)
    response = await stub.Complete(
        worker_pb2.CompleteRequest(
            session=worker.session,
            results=[
                worker_pb2.TaskResult(
                    dispatch_id=lease.dispatch_id,
                    lease_token=lease.lease_token,
                    outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
                    replayed=replayed,
                )
            ],
        ),
        timeout=30,
    )
    assert response.answers[0].outcome == OK
    run: runs_pb2.GetRunResponse = await control.GetRun(
        runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=ADMIN, timeout=30
    )
    (task,) = run.tasks
    assert (task.saved.steps, task.saved.tokens, task.saved.cost_usd) == (2, 1500, 0.25)
    bad = await expect_error(
        stub.Complete(
            worker_pb2.CompleteRequest(
                session=worker.session,
                results=[
                    worker_pb2.TaskResult(
                        dispatch_id=lease.dispatch_id,
                        lease_token=lease.lease_token,
                        outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
                        replayed=types_pb2.MemoSavings(cost_usd=float("nan")),
                    )
                ],
            ),
            timeout=30,
        )
    )
    assert bad.fields == ["results[0].replayed.cost_usd"]
