"""WorkerService over real gRPC and PostgreSQL, driven with the raw generated stubs."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import duration_pb2, json_format, struct_pb2

from awp.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from awp_db import dispatching, locks, settle
from awp_db.connect import Pool
from awp_db.events import EventBatch
from awp_db.signals import DISPATCH_CHANNEL
from support import (
    WORKER_TOKEN,
    ServerFactory,
    ServerHandle,
    expect_error,
    poll_until,
    spec,
    start_run,
)

AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)


@dataclass
class Worker:
    stub: worker_pb2_grpc.WorkerServiceStub
    session: worker_pb2.Session

    async def claim(self, n: int = 1, wait_s: float = 0.0) -> list[worker_pb2.Lease]:
        wait = duration_pb2.Duration()
        wait.FromMilliseconds(int(wait_s * 1000))
        response = await self.stub.Claim(
            worker_pb2.ClaimRequest(session=self.session, max_leases=n, wait=wait)
        )
        return list(response.leases)

    async def complete(
        self, lease: worker_pb2.Lease, output: dict[str, object] | None = None, *, token: str = ""
    ) -> int:
        result = worker_pb2.TaskResult(
            dispatch_id=lease.dispatch_id,
            lease_token=token or lease.lease_token,
            outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
            output=_struct(output or {"ok": True}),
        )
        response = await self.stub.Complete(
            worker_pb2.CompleteRequest(session=self.session, results=[result])
        )
        return response.answers[0].outcome

    async def fail(self, lease: worker_pb2.Lease, message: str, retryable: bool) -> int:
        result = worker_pb2.TaskResult(
            dispatch_id=lease.dispatch_id,
            lease_token=lease.lease_token,
            outcome=worker_pb2.RESULT_OUTCOME_FAILED,
            error=types_pb2.TaskError(message=message, retryable=retryable),
        )
        response = await self.stub.Complete(
            worker_pb2.CompleteRequest(session=self.session, results=[result])
        )
        return response.answers[0].outcome


def _struct(data: dict[str, object]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(data)
    return value


@pytest.fixture
async def stub(awp_server: ServerHandle) -> AsyncIterator[worker_pb2_grpc.WorkerServiceStub]:
    async with awp_server.channel() as channel:
        yield worker_pb2_grpc.WorkerServiceStub(channel)


async def register(
    stub: worker_pb2_grpc.WorkerServiceStub,
    concurrency: int = 4,
    kinds: tuple[str, ...] = ("mock",),
) -> Worker:
    response = await stub.Register(
        worker_pb2.RegisterRequest(
            name="test-worker",
            protocol_version=1,
            executor_kinds=list(kinds),
            max_concurrency=concurrency,
        ),
        metadata=AUTH,
    )
    return Worker(stub, response.session)


async def dispatch_all(pool: Pool) -> int:
    async with pool.acquire() as conn:
        return (await dispatching.create_dispatches(conn)).created


async def revision(pool: Pool, run_id: object) -> int:
    value: int = await pool.fetchval("SELECT revision FROM runs WHERE id = $1", run_id)
    return value


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
    forged = Worker(stub, worker_pb2.Session(worker_id=worker.session.worker_id, session_token="x"))
    error = await expect_error(forged.claim())
    assert (error.code, error.reason) == (grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID")
    unknown = Worker(stub, worker_pb2.Session(worker_id="not-a-uuid", session_token="x"))
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
    run_id = await start_run(pool, spec(tasks=2))
    worker = await register(stub)
    await dispatch_all(pool)
    first, second = await worker.claim(2)
    before = await revision(pool, run_id)
    outcome = await worker.complete(first, token=second.lease_token)
    assert outcome == worker_pb2.COMPLETE_OUTCOME_LEASE_LOST
    assert await revision(pool, run_id) == before


async def test_duplicate_complete_is_idempotent_and_a_changed_result_conflicts(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=2))
    worker = await register(stub)
    await dispatch_all(pool)
    lease, _ = await worker.claim(2)
    assert await worker.complete(lease, {"n": 1}) == worker_pb2.COMPLETE_OUTCOME_ACCEPTED
    after_accept = await revision(pool, run_id)
    assert await worker.complete(lease, {"n": 1}) == worker_pb2.COMPLETE_OUTCOME_DUPLICATE
    assert await worker.complete(lease, {"n": 2}) == worker_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT
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
        assert await worker.complete(lease) == worker_pb2.COMPLETE_OUTCOME_LEASE_LOST
        assert await revision(pool, run_id) == before
        state = await pool.fetchval("SELECT state FROM dispatches WHERE id = $1", lease.dispatch_id)
        assert state == "leased", "nothing settles it but the reaper"


async def test_success_unlocks_dependents_and_hands_them_upstream_outputs(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=2, chain=True), run_input={"topic": "x"})
    worker = await register(stub)
    await dispatch_all(pool)
    (first,) = await worker.claim(5)
    assert first.task_key == "t0"
    assert dict(first.upstream_outputs) == {}
    assert await worker.complete(first, {"found": 3}) == worker_pb2.COMPLETE_OUTCOME_ACCEPTED
    state = await pool.fetchval("SELECT state FROM tasks WHERE run_id = $1 AND key = 't1'", run_id)
    assert state == "ready"
    await dispatch_all(pool)
    (second,) = await worker.claim(5)
    assert second.fencing_token > first.fencing_token
    # Each lease carries the run input and its dependencies' outputs.
    assert json_format.MessageToDict(second.run_input) == {"topic": "x"}
    assert json_format.MessageToDict(second.upstream_outputs["t0"]) == {"found": 3}
    assert await worker.complete(second) == worker_pb2.COMPLETE_OUTCOME_ACCEPTED
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id) == "succeeded"


async def test_retryable_failure_waits_and_final_failure_fails_the_run(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=3, max_attempts=1, backoff_ms=5_000))
    worker = await register(stub)
    await dispatch_all(pool)
    first, second, _third = await worker.claim(3)
    assert await worker.fail(first, "boom", retryable=False) == worker_pb2.COMPLETE_OUTCOME_ACCEPTED
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id) == "failed"
    states = dict(await pool.fetch("SELECT key, state FROM tasks WHERE run_id = $1", run_id))
    assert states[first.task_key] == "failed"
    assert states[second.task_key] == "canceled"
    # The other holders' leases were revoked: their results are now late.
    assert await worker.complete(second) == worker_pb2.COMPLETE_OUTCOME_LEASE_LOST


async def test_retryable_failure_goes_to_waiting_retry_while_attempts_remain(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=1, max_attempts=2, backoff_ms=5_000))
    worker = await register(stub)
    await dispatch_all(pool)
    (lease,) = await worker.claim()
    assert await worker.fail(lease, "flaky", retryable=True) == worker_pb2.COMPLETE_OUTCOME_ACCEPTED
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


# --- Heartbeat ------------------------------------------------------------------------


class Stream:
    """One heartbeat stream: send a request, read its answer."""

    def __init__(self, stub: worker_pb2_grpc.WorkerServiceStub) -> None:
        self.queue: asyncio.Queue[worker_pb2.HeartbeatRequest] = asyncio.Queue()
        self.call = stub.Heartbeat(self._requests())

    async def _requests(self) -> AsyncIterator[worker_pb2.HeartbeatRequest]:
        while True:
            yield await self.queue.get()

    async def beat(
        self, worker: Worker, held: list[worker_pb2.Lease], token: str = ""
    ) -> worker_pb2.HeartbeatResponse:
        await self.queue.put(
            worker_pb2.HeartbeatRequest(
                session=worker.session,
                leases=[
                    worker_pb2.LeaseRef(
                        dispatch_id=lease.dispatch_id, lease_token=token or lease.lease_token
                    )
                    for lease in held
                ],
            )
        )
        response = await self.call.read()
        assert response is not grpc.aio.EOF
        return response  # type: ignore[return-value]

    def cancel(self) -> None:
        self.call.cancel()


async def test_heartbeat_renews_revokes_and_rejects_unknown_leases(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=2))
    worker = await register(stub)
    await dispatch_all(pool)
    first, second = await worker.claim(2)
    stream = Stream(stub)
    try:
        answer = await stream.beat(worker, [first, second])
        assert answer.session_state == types_pb2.WORKER_STATE_ACTIVE
        assert [lease.status for lease in answer.leases] == [worker_pb2.LEASE_STATUS_RENEWED] * 2
        assert answer.leases[0].lease_remaining.ToMilliseconds() > 14_000
        forged = await stream.beat(worker, [first], token=second.lease_token)
        assert [lease.status for lease in forged.leases] == [worker_pb2.LEASE_STATUS_UNKNOWN]
        async with pool.acquire() as conn, conn.transaction():
            events = EventBatch()
            await locks.runs(conn, [run_id])
            await settle.stop_runs(conn, [run_id], "canceled", events)
            await events.flush(conn)
        revoked = await stream.beat(worker, [first, second])
        assert {lease.status for lease in revoked.leases} == {worker_pb2.LEASE_STATUS_REVOKED}
    finally:
        stream.cancel()


async def lease_seconds_left(pool: Pool, dispatch_id: int) -> float:
    """Until the lease expires, by the database clock."""
    left: float = await pool.fetchval(
        "SELECT extract(epoch FROM lease_expires_at - clock_timestamp()) FROM dispatches"
        " WHERE id = $1",
        dispatch_id,
    )
    return left


async def test_a_dropped_stream_shortens_leases_and_a_quick_reconnect_keeps_them(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    await start_run(pool, spec(tasks=1))
    worker = await register(stub)
    await dispatch_all(pool)
    (lease,) = await worker.claim()

    def seconds_left_below(limit: float) -> Callable[[], Awaitable[bool]]:
        async def probe() -> bool:
            return await lease_seconds_left(pool, lease.dispatch_id) < limit

        return probe

    stream = Stream(stub)
    await stream.beat(worker, [lease])
    assert await lease_seconds_left(pool, lease.dispatch_id) > 10
    stream.cancel()
    # The server sees the stream go and shortens the lease to the 1 s grace.
    await poll_until(seconds_left_below(1.5))
    reconnected = Stream(stub)
    try:
        answer = await reconnected.beat(worker, [lease])
        assert answer.leases[0].status == worker_pb2.LEASE_STATUS_RENEWED
        assert await lease_seconds_left(pool, lease.dispatch_id) > 10
    finally:
        reconnected.cancel()


async def test_a_stale_stream_ending_does_not_shorten_a_newer_streams_leases(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    await start_run(pool, spec(tasks=1))
    worker = await register(stub)
    await dispatch_all(pool)
    (lease,) = await worker.claim()
    old = Stream(stub)
    await old.beat(worker, [lease])
    new = Stream(stub)
    try:
        await new.beat(worker, [lease])
        old.cancel()
        await asyncio.sleep(0)  # let the server notice; nothing must change
        answer = await new.beat(worker, [lease])
        assert answer.leases[0].status == worker_pb2.LEASE_STATUS_RENEWED
        assert await lease_seconds_left(pool, lease.dispatch_id) > 10
    finally:
        new.cancel()


# --- Drain ----------------------------------------------------------------------------


async def test_drain_stops_claims_then_stops_the_session(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=2))
    worker = await register(stub)
    await dispatch_all(pool)
    (first,) = await worker.claim(1)
    drained = await stub.Drain(worker_pb2.DrainRequest(session=worker.session))
    assert drained.session_state == types_pb2.WORKER_STATE_DRAINING
    assert drained.active_leases == 1
    assert (await expect_error(worker.claim())).reason == "WORKER_DRAINING"
    assert await worker.complete(first) == worker_pb2.COMPLETE_OUTCOME_ACCEPTED
    stopped = await stub.Drain(worker_pb2.DrainRequest(session=worker.session))
    assert stopped.session_state == types_pb2.WORKER_STATE_STOPPED
    assert (await expect_error(worker.claim())).reason == "SESSION_INVALID"
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id) == "running"


async def test_hand_back_settles_leases_at_once_as_interrupted(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id = await start_run(pool, spec(tasks=2, backoff_ms=0))
    worker = await register(stub)
    await dispatch_all(pool)
    held = await worker.claim(2)
    drained = await stub.Drain(
        worker_pb2.DrainRequest(
            session=worker.session,
            hand_back=[
                worker_pb2.LeaseRef(dispatch_id=lease.dispatch_id, lease_token=lease.lease_token)
                for lease in held
            ],
        )
    )
    assert drained.session_state == types_pb2.WORKER_STATE_STOPPED
    assert drained.active_leases == 0
    attempts = Counter(
        row["state"]
        for row in await pool.fetch("SELECT state FROM attempts WHERE run_id = $1", run_id)
    )
    assert attempts == {"interrupted": 2}
    tasks = {
        row["state"]
        for row in await pool.fetch("SELECT state FROM tasks WHERE run_id = $1", run_id)
    }
    assert tasks == {"waiting_retry"}


async def test_server_shutdown_ends_streams_at_once_and_keeps_leases(
    start_server: ServerFactory, pool: Pool
) -> None:
    server = await start_server()
    async with server.channel() as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        await start_run(pool, spec(tasks=1))
        worker = await register(stub)
        await dispatch_all(pool)
        (lease,) = await worker.claim()
        stream = Stream(stub)
        await stream.beat(worker, [lease])
        parked = asyncio.create_task(worker.claim(1, wait_s=25))
        listener = server.running.listener
        await poll_until(lambda: listener.waiting(DISPATCH_CHANNEL) > 0)
        # With a 30 s grace, only ending the stream and the parked claim lets stop finish.
        await asyncio.wait_for(server.running.stop(30), 10)
        assert await stream.call.read() is grpc.aio.EOF
        assert await asyncio.wait_for(parked, 5) == []
    left = await lease_seconds_left(pool, lease.dispatch_id)
    assert left > 10, "a shutting-down server must not shorten its workers' leases"
