"""The server speaks first on a heartbeat stream (worker.proto, Heartbeat): a lease
revoked under its holder is answered REVOKED without waiting for the next request, and
when the notice is lost, the server's LISTEN connection coming back checks every
stream's last-reported leases instead.

The heartbeat interval is 30 s: a REVOKED that arrives sooner than the bounds below was
pushed, not answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from uuid import UUID

import pytest

from awp.v1 import worker_pb2, worker_pb2_grpc
from awp_db.connect import Pool
from kit import WORKER_TOKEN, ServerFactory, ServerHandle, poll_until, spec, start_run
from kit.db import converge_cancel, dispatch_all, revocation_notices_off
from kit.rawworker import RawWorker

HEARTBEAT_INTERVAL_S = 30.0
RENEWED = worker_pb2.LEASE_STATUS_RENEWED
REVOKED = worker_pb2.LEASE_STATUS_REVOKED


@pytest.fixture
async def server(start_server: ServerFactory) -> ServerHandle:
    return await start_server(heartbeat_interval_s=HEARTBEAT_INTERVAL_S, lease_ttl_s=90.0)


@contextlib.asynccontextmanager
async def _holding(
    server: ServerHandle, pool: Pool, tasks: int
) -> AsyncIterator[tuple[RawWorker, UUID, list[int]]]:
    """A worker whose stream has reported (and renewed) every lease of a running run."""
    run_id = await start_run(pool, spec("push", tasks=tasks))
    async with server.channel() as channel:
        worker = RawWorker(worker_pb2_grpc.WorkerServiceStub(channel), WORKER_TOKEN, "raw")
        await worker.register(concurrency=tasks)
        await dispatch_all(pool)
        held = [lease.dispatch_id for lease in await worker.claim(tasks)]
        assert len(held) == tasks
        worker.start_heartbeat()

        async def renewed() -> bool:
            return all(worker.answers.get(d) == [RENEWED] for d in held)

        await poll_until(renewed, within=10)
        try:
            yield worker, run_id, held
        finally:
            await worker.stop_heartbeat()


@pytest.fixture
async def holder(server: ServerHandle, pool: Pool) -> AsyncIterator[tuple[RawWorker, UUID, int]]:
    async with _holding(server, pool, 1) as (worker, run_id, (dispatch_id,)):
        yield worker, run_id, dispatch_id


async def _revoked(worker: RawWorker, dispatch_id: int, within: float) -> None:
    async def told() -> bool:
        return worker.answers.get(dispatch_id) == [RENEWED, REVOKED]

    await poll_until(told, "REVOKED pushed", within=within)


async def test_a_cancel_is_pushed_down_the_holders_stream(
    holder: tuple[RawWorker, UUID, int], pool: Pool
) -> None:
    worker, run_id, dispatch_id = holder
    await converge_cancel(pool, run_id)
    await _revoked(worker, dispatch_id, within=5.0)


async def test_a_mass_cancel_is_pushed_whole(server: ServerHandle, pool: Pool) -> None:
    async with _holding(server, pool, 50) as (worker, run_id, held):
        await converge_cancel(pool, run_id)

        async def all_told() -> bool:
            return all(worker.answers.get(d) == [RENEWED, REVOKED] for d in held)

        await poll_until(all_told, "REVOKED pushed for every lease", within=5.0)


async def test_a_lost_notice_is_made_up_for_when_the_listener_reconnects(
    holder: tuple[RawWorker, UUID, int], pool: Pool, database_dsn: str
) -> None:
    worker, run_id, dispatch_id = holder
    async with revocation_notices_off(pool):  # the cancel's notice is lost
        await converge_cancel(pool, run_id)
    assert worker.answers[dispatch_id] == [RENEWED]
    # The server's LISTEN connection breaks; on reconnect, whatever was missed is read
    # again: the stream's last-reported lease is checked and found revoked.
    terminated = await pool.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = 'awp-listener' AND datname = current_database()"
    )
    assert terminated == 1
    # The listener notices within its keepalive (5 s), then reconnects: well under the
    # 30 s heartbeat interval.
    await _revoked(worker, dispatch_id, within=15.0)
