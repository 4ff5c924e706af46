"""WorkerService over real gRPC and PostgreSQL, driven with the raw generated stubs:
Register, Claim, Complete. Heartbeat and Drain are in test_worker_service_sessions.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from awp.v1 import session_pb2, types_pb2, worker_pb2, worker_pb2_grpc
from awp_db.connect import Pool
from kit import (
    WORKER_TOKEN,
    ServerHandle,
    expect_error,
    poll_until,
    spec,
    start_run,
)
from kit.db import dispatch_all, revision
from kit.proto import to_dict
from kit.rawworker import RawWorker, leased, register

AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)


# --- Register -------------------------------------------------------------------------


async def test_register_needs_the_worker_token(stub: worker_pb2_grpc.WorkerServiceStub) -> None:
    request = worker_pb2.RegisterRequest(
        name="w", protocol_version=1, executor_kinds=["mock"], max_concurrency=1
    )
    error = await expect_error(stub.Register(request))
    assert (error.code, error.reason) == (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID")
    error = await expect_error(
        stub.Register(request, metadata=(("authorization", "Bearer wrong"),))
    )
    assert error.reason == "TOKEN_INVALID"


async def test_register_rejects_an_unsupported_protocol(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    error = await expect_error(
        stub.Register(
            worker_pb2.RegisterRequest(
                name="w", protocol_version=2, executor_kinds=["mock"], max_concurrency=1
            ),
            metadata=AUTH,
        )
    )
    assert (error.code, error.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "PROTOCOL_UNSUPPORTED",
    )


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"name": "", "executor_kinds": ["mock"], "max_concurrency": 1}, "name"),
        ({"name": "w", "executor_kinds": [], "max_concurrency": 1}, "executor_kinds"),
        ({"name": "w", "executor_kinds": ["Mock!"], "max_concurrency": 1}, "executor_kinds[0]"),
        ({"name": "w", "executor_kinds": ["mock"], "max_concurrency": 0}, "max_concurrency"),
        ({"name": "w", "executor_kinds": ["mock"], "max_concurrency": 1001}, "max_concurrency"),
    ],
)
async def test_register_names_the_bad_field(
    stub: worker_pb2_grpc.WorkerServiceStub, request_fields: dict[str, object], field: str
) -> None:
    error = await expect_error(
        stub.Register(
            worker_pb2.RegisterRequest(protocol_version=1, **request_fields),  # type: ignore[arg-type]
            metadata=AUTH,
        )
    )
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.fields == [field]


async def test_a_wrong_session_token_is_session_invalid(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    worker = await register(stub)
    forged = RawWorker(
        stub,
        WORKER_TOKEN,
        "forged",
        session_pb2.Session(worker_id=worker.session.worker_id, session_token="x"),
    )
    error = await expect_error(forged.claim())
    assert (error.code, error.reason) == (grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID")
    made_up = session_pb2.Session(worker_id="not-a-uuid", session_token="x")
    unknown = RawWorker(stub, WORKER_TOKEN, "unknown", made_up)
    assert (await expect_error(unknown.claim())).reason == "SESSION_INVALID"


# --- Claim ----------------------------------------------------------------------------


async def test_claim_leases_with_durations_fencing_and_idempotency_key(
    stub: worker_pb2_grpc.WorkerServiceStub, awp_server: ServerHandle, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=3, timeout_ms=5_000))
    worker = await register(stub, concurrency=8)
    assert await dispatch_all(pool) == 3
    issued = await worker.claim(10)
    assert len(issued) == 3
    tokens = [lease.fencing_token for lease in issued]
    assert len(set(tokens)) == 3 and all(t > 0 for t in tokens)
    for lease in issued:
        assert lease.run_id == str(run_id)
        assert lease.idempotency_key == f"{run_id}/{lease.task_key}"
        assert lease.attempt == 1 and lease.max_attempts == 3
        # The task timeout (5 s) caps the lease below the 15 s TTL.
        assert 0 < lease.lease_remaining.ToMilliseconds() <= 5_000
        assert lease.lease_remaining.ToMilliseconds() <= lease.attempt_remaining.ToMilliseconds()
        assert lease.lease_expires_at.ToDatetime() <= lease.attempt_deadline.ToDatetime()
    states = await pool.fetch("SELECT state FROM tasks WHERE run_id = $1", run_id)
    assert {row["state"] for row in states} == {"running"}
    assert await pool.fetchval("SELECT count(*) FROM attempts WHERE run_id = $1", run_id) == 3


async def test_claim_never_exceeds_free_slots(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    await start_run(pool, spec(tasks=10))
    worker = await register(stub, concurrency=3)
    await register(stub, concurrency=10)  # capacity for dispatches beyond the first worker
    await dispatch_all(pool)
    assert len(await worker.claim(10)) == 3
    assert await worker.claim(10) == []


async def test_an_empty_claim_is_normal(stub: worker_pb2_grpc.WorkerServiceStub) -> None:
    worker = await register(stub)
    assert await worker.claim(4, wait_s=0.2) == []


async def test_a_parked_claim_wakes_when_work_appears(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    worker = await register(stub)
    parked = asyncio.create_task(worker.claim(1, wait_s=20))
    await start_run(pool, spec(tasks=1))
    await dispatch_all(pool)
    issued = await asyncio.wait_for(parked, 15)
    assert len(issued) == 1


async def test_50_concurrent_claimers_never_share_a_dispatch(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    await start_run(pool, spec(tasks=200))
    claimers = [await register(stub, concurrency=3 + i % 4) for i in range(50)]
    await dispatch_all(pool)
    # Every claimer asks for more than it may hold, twice, all at once.
    batches = await asyncio.gather(*(w.claim(10) for w in claimers for _ in range(2)))
    issued = [lease.dispatch_id for batch in batches for lease in batch]
    assert len(issued) == len(set(issued)), "a dispatch was leased twice"
    rows = await pool.fetch(
        """SELECT w.max_concurrency, count(d.id) AS held FROM workers w
           LEFT JOIN dispatches d ON d.worker_id = w.id AND d.state = 'leased'
           GROUP BY w.id"""
    )
    assert all(row["held"] <= row["max_concurrency"] for row in rows)
    assert sum(row["held"] for row in rows) == len(issued)
    assert len(issued) == min(200, sum(3 + i % 4 for i in range(50)))


# --- Complete and fencing -------------------------------------------------------------


async def test_a_token_valid_for_another_dispatch_is_rejected(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id, worker, (first, second) = await leased(stub, pool, spec(tasks=2), 2)
    before = await revision(pool, run_id)
    outcome = await worker.complete(first, token=second.lease_token)
    assert outcome == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
    assert await revision(pool, run_id) == before


async def test_duplicate_complete_is_idempotent_and_a_changed_result_conflicts(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id, worker, (lease, _) = await leased(stub, pool, spec(tasks=2), 2)
    assert await worker.complete(lease, {"n": 1}) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    after_accept = await revision(pool, run_id)
    assert await worker.complete(lease, {"n": 1}) == session_pb2.COMPLETE_OUTCOME_DUPLICATE
    assert await worker.complete(lease, {"n": 2}) == session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT
    assert await revision(pool, run_id) == after_accept
    output = await pool.fetchval(
        "SELECT output FROM tasks WHERE run_id = $1 AND key = $2", run_id, lease.task_key
    )
    assert output == {"n": 1}


async def test_a_lease_past_its_expiry_is_lost_without_any_reaper(
    start_server: object, pool: Pool
) -> None:
    server: ServerHandle = await start_server(lease_ttl_s=0.3)  # type: ignore[operator]
    async with server.channel() as channel:
        worker = await register(worker_pb2_grpc.WorkerServiceStub(channel))
        run_id = await start_run(pool, spec(tasks=1))
        await dispatch_all(pool)
        (lease,) = await worker.claim()
        await poll_until(
            lambda: pool.fetchval(
                "SELECT clock_timestamp() > lease_expires_at FROM dispatches WHERE id = $1",
                lease.dispatch_id,
            )
        )
        before = await revision(pool, run_id)
        assert await worker.complete(lease) == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
        assert await revision(pool, run_id) == before
        state = await pool.fetchval("SELECT state FROM dispatches WHERE id = $1", lease.dispatch_id)
        assert state == "leased", "nothing settles it but the reaper"


async def test_success_unlocks_dependents_and_hands_them_upstream_outputs(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id, worker, (first,) = await leased(
        stub, pool, spec(tasks=2, chain=True), 5, run_input={"topic": "x"}
    )
    assert first.task_key == "t0"
    assert dict(first.upstream_outputs) == {}
    assert await worker.complete(first, {"found": 3}) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    state = await pool.fetchval("SELECT state FROM tasks WHERE run_id = $1 AND key = 't1'", run_id)
    assert state == "ready"
    await dispatch_all(pool)
    (second,) = await worker.claim(5)
    assert second.fencing_token > first.fencing_token
    # Each lease carries the run input and its dependencies' outputs.
    assert to_dict(second.run_input) == {"topic": "x"}
    assert to_dict(second.upstream_outputs["t0"]) == {"found": 3}
    assert await worker.complete(second) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id) == "succeeded"


async def test_retryable_failure_waits_and_final_failure_fails_the_run(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id, worker, (first, second, _third) = await leased(
        stub, pool, spec(tasks=3, max_attempts=1, backoff_ms=5_000), 3
    )
    assert (
        await worker.fail(first, "boom", retryable=False) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    )
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id) == "failed"
    states = dict(await pool.fetch("SELECT key, state FROM tasks WHERE run_id = $1", run_id))
    assert states[first.task_key] == "failed"
    assert states[second.task_key] == "canceled"
    # The other holders' leases were revoked: their results are now late.
    assert await worker.complete(second) == session_pb2.COMPLETE_OUTCOME_LEASE_LOST


async def test_retryable_failure_goes_to_waiting_retry_while_attempts_remain(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id, worker, (lease,) = await leased(
        stub, pool, spec(tasks=1, max_attempts=2, backoff_ms=5_000)
    )
    assert (
        await worker.fail(lease, "flaky", retryable=True) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    )
    row = await pool.fetchrow(
        "SELECT state, retry_at - now() AS wait FROM tasks WHERE run_id = $1", run_id
    )
    assert row["state"] == "waiting_retry"
    assert row["wait"].total_seconds() > 3


@pytest.mark.parametrize(
    ("result", "field"),
    [
        (worker_pb2.TaskResult(dispatch_id=1, lease_token="x"), "results[0].outcome"),
        (
            worker_pb2.TaskResult(
                dispatch_id=1,
                lease_token="x",
                outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
                error=types_pb2.TaskError(message="?"),
            ),
            "results[0].error",
        ),
    ],
)
async def test_complete_rejects_malformed_results(
    stub: worker_pb2_grpc.WorkerServiceStub, result: worker_pb2.TaskResult, field: str
) -> None:
    worker = await register(stub)
    error = await expect_error(
        stub.Complete(worker_pb2.CompleteRequest(session=worker.session, results=[result]))
    )
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.fields == [field]


async def test_complete_refuses_a_nul_in_an_error_message_naming_it_and_writes_nothing(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    """PostgreSQL text cannot hold NUL: the whole Complete is refused as bad input
    (INVALID_ARGUMENT naming the result), never INTERNAL, and none of it is stored."""
    run_id, worker, leases = await leased(stub, pool, spec(tasks=4), 4)
    results = [
        worker_pb2.TaskResult(
            dispatch_id=lease.dispatch_id,
            lease_token=lease.lease_token,
            outcome=worker_pb2.RESULT_OUTCOME_FAILED,
            error=types_pb2.TaskError(message="bad\x00byte" if i == 3 else "fine"),
        )
        for i, lease in enumerate(leases)
    ]
    before = await revision(pool, run_id)
    error = await expect_error(
        stub.Complete(worker_pb2.CompleteRequest(session=worker.session, results=results))
    )
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert error.fields == ["results[3].error.message"]
    assert await revision(pool, run_id) == before
    states = await pool.fetch("SELECT state FROM tasks WHERE run_id = $1", run_id)
    assert {row["state"] for row in states} == {"running"}


async def test_when_a_run_fails_a_running_sibling_is_canceled_and_an_unstarted_one_skipped(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    """DESIGN.md §3: a task that had started is canceled (its attempt is stopped); one
    that never ran is skipped."""
    run_id, worker, (first, _second) = await leased(
        stub, pool, spec(tasks=3, max_attempts=1, depends={2: [0]}), 2
    )
    assert (
        await worker.fail(first, "boom", retryable=False) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    )
    states = dict(await pool.fetch("SELECT key, state FROM tasks WHERE run_id = $1", run_id))
    assert states == {"t0": "failed", "t1": "canceled", "t2": "skipped"}
    attempts = dict(
        await pool.fetch(
            "SELECT t.key, a.state FROM attempts a JOIN tasks t ON t.id = a.task_id"
            " WHERE a.run_id = $1",
            run_id,
        )
    )
    assert attempts == {"t0": "failed", "t1": "canceled"}
