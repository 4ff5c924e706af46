"""The heartbeat interval is the servers' alone: each session keeps the one its server gave
it at Register, and the coordinator, which has no interval setting, judges silence in it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from uuid import UUID

import grpc
from coordinator_support import coordinator

from awp.v1 import session_pb2, worker_pb2, worker_pb2_grpc
from awp_coordinator.config import OFFLINE_AFTER_INTERVALS
from awp_db.connect import Pool
from kit import WORKER_TOKEN, ServerFactory, poll_until

AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)


async def register(stub: worker_pb2_grpc.WorkerServiceAsyncStub, name: str) -> session_pb2.Session:
    response = await stub.Register(
        worker_pb2.RegisterRequest(
            name=name, protocol_version=1, executor_kinds=["mock"], max_concurrency=1
        ),
        metadata=AUTH,
        timeout=10,
    )
    return response.session


@contextlib.asynccontextmanager
async def heartbeating(
    stub: worker_pb2_grpc.WorkerServiceAsyncStub, session: session_pb2.Session, every: float
) -> AsyncIterator[None]:
    """Heartbeats session at the server's interval, as a healthy worker does."""

    async def requests() -> AsyncIterator[worker_pb2.HeartbeatRequest]:
        while True:
            yield worker_pb2.HeartbeatRequest(session=session)
            await asyncio.sleep(every)

    call = stub.Heartbeat(requests())

    async def drain() -> None:
        async for _ in call:
            pass

    task = asyncio.create_task(drain())
    try:
        yield
    finally:
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await task


async def state(pool: Pool, session: session_pb2.Session) -> str:
    found: str = await pool.fetchval(
        "SELECT state FROM workers WHERE id = $1", UUID(session.worker_id)
    )
    return found


async def test_a_silent_session_goes_offline_after_three_of_its_servers_intervals(
    start_server: ServerFactory, pool: Pool, database_dsn: str
) -> None:
    interval = 0.2
    server = await start_server(heartbeat_interval_s=interval, lease_ttl_s=1.0)
    # No interval of its own, no offline override: only what the sessions carry.
    coord = coordinator(pool, database_dsn, scan_interval_s=0.05)
    assert coord.config.offline_rule.floor_ms == 0
    stop = asyncio.Event()
    coordinating = asyncio.create_task(coord.run(stop))
    async with server.channel() as channel:
        stub: worker_pb2_grpc.WorkerServiceAsyncStub = worker_pb2_grpc.WorkerServiceStub(channel)
        lively = await register(stub, "lively")
        try:
            async with heartbeating(stub, lively, interval):
                silent = await register(stub, "silent")
                stored = await pool.fetchval(
                    "SELECT heartbeat_interval_ms FROM workers WHERE id = $1",
                    UUID(silent.worker_id),
                )
                assert stored == 200  # the server's, as the worker was told

                async def offline() -> bool:
                    return await state(pool, silent) == "offline"

                await poll_until(offline, within=10)
                # Not before 3 of the session's intervals of silence (database clock).
                silence = await pool.fetchval(
                    "SELECT extract(epoch FROM stopped_at - last_heartbeat_at)::float8"
                    "  FROM workers WHERE id = $1",
                    UUID(silent.worker_id),
                )
                assert silence >= OFFLINE_AFTER_INTERVALS * interval

                # A hold for a duration, not a synchronisation: sample the state throughout
                # ten of the intervals that took the silent session offline in three.
                loop = asyncio.get_running_loop()
                watch_until = loop.time() + 10 * interval
                states = []
                while loop.time() < watch_until:
                    states.append(await state(pool, lively))
                    await asyncio.sleep(0.05)
                assert set(states) == {"active"}, states
        finally:
            stop.set()
            async with asyncio.timeout(10):
                await coordinating
