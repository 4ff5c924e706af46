"""WorkerService over real gRPC and PostgreSQL, driven with the raw generated stubs:
the Heartbeat stream and Drain, the life of a session's leases."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from awp.v1 import session_pb2, types_pb2, worker_pb2, worker_pb2_grpc
from awp_db import locks, settle
from awp_db.connect import Pool
from awp_db.events import EventBatch
from awp_db.signals import DISPATCH_CHANNEL
from kit import (
    WORKER_TOKEN,
    ServerFactory,
    expect_error,
    poll_until,
    spec,
)
from kit.db import revocation_notices_off
from kit.rawworker import RawWorker, leased

AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)


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
        self, worker: RawWorker, held: list[worker_pb2.Lease], token: str = ""
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
    run_id, worker, (first, second) = await leased(stub, pool, spec(tasks=2), 2)
    stream = Stream(stub)
    try:
        answer = await stream.beat(worker, [first, second])
        assert answer.session_state == types_pb2.WORKER_STATE_ACTIVE
        assert [lease.status for lease in answer.leases] == [worker_pb2.LEASE_STATUS_RENEWED] * 2
        assert answer.leases[0].lease_remaining.ToMilliseconds() > 14_000
        forged = await stream.beat(worker, [first], token=second.lease_token)
        assert [lease.status for lease in forged.leases] == [worker_pb2.LEASE_STATUS_UNKNOWN]
        # No push (tests/server/test_heartbeat_push.py): the next read is the answer.
        async with revocation_notices_off(pool), pool.acquire() as conn, conn.transaction():
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


async def assert_renews(
    stream: Stream, worker: RawWorker, lease: worker_pb2.Lease, pool: Pool
) -> None:
    """The stream's next beat renews the lease in full (well above the 1 s grace)."""
    answer = await stream.beat(worker, [lease])
    assert answer.leases[0].status == worker_pb2.LEASE_STATUS_RENEWED
    assert await lease_seconds_left(pool, lease.dispatch_id) > 10


async def test_a_dropped_stream_shortens_leases_and_a_quick_reconnect_keeps_them(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))

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
        await assert_renews(reconnected, worker, lease, pool)
    finally:
        reconnected.cancel()


async def test_a_stale_stream_ending_does_not_shorten_a_newer_streams_leases(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    old = Stream(stub)
    await old.beat(worker, [lease])
    new = Stream(stub)
    try:
        await new.beat(worker, [lease])
        old.cancel()
        await asyncio.sleep(0)  # let the server notice; nothing must change
        await assert_renews(new, worker, lease, pool)
    finally:
        new.cancel()


# --- Drain ----------------------------------------------------------------------------


async def test_drain_stops_claims_then_stops_the_session(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    run_id, worker, (first,) = await leased(stub, pool, spec(tasks=2))
    drained = await stub.Drain(worker_pb2.DrainRequest(session=worker.session))
    assert drained.session_state == types_pb2.WORKER_STATE_DRAINING
    assert drained.active_leases == 1
    assert (await expect_error(worker.claim())).reason == "WORKER_DRAINING"
    assert await worker.complete(first) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    stopped = await stub.Drain(worker_pb2.DrainRequest(session=worker.session))
    assert stopped.session_state == types_pb2.WORKER_STATE_STOPPED
    assert (await expect_error(worker.claim())).reason == "SESSION_INVALID"
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id) == "running"


async def test_hand_back_settles_leases_at_once_as_interrupted(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    # A long backoff and one attempt each: a hand-back must cost neither.
    run_id, worker, held = await leased(
        stub, pool, spec(tasks=2, max_attempts=1, backoff_ms=60_000), 2
    )
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
        (row["state"], row["hand_backs"])
        for row in await pool.fetch("SELECT state, hand_backs FROM tasks WHERE run_id = $1", run_id)
    }
    assert tasks == {("ready", 1)}


async def test_server_shutdown_ends_streams_at_once_and_keeps_leases(
    start_server: ServerFactory, pool: Pool
) -> None:
    server = await start_server()
    async with server.channel() as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
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
