"""WorkerRuntime against a scriptable in-memory WorkerService (worker_fakes): drains,
hand-backs and what an unexpected failure stops."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from runtime_harness import Running, make_config, start
from worker_fakes import FakeServer, Fault, start_fake

from awp.v1 import worker_pb2
from awp_worker import ActionContext
from awp_worker._config import WorkerConfig
from awp_worker._executors import MockExecutor
from awp_worker._lifecycle import EXIT_FAILURE, EXIT_OK
from awp_worker._runtime import WorkerRuntime
from kit import poll_until as eventually
from kit.proto import output

# --- Drain ----------------------------------------------------------------------------


async def test_shutdown_drains_finishes_running_leases_and_stops(fake: FakeServer) -> None:
    service = fake.service
    task = await service.add("slow", {"sleep_ms": 500})
    worker = start(fake)
    worker_id = await worker.registered()
    await eventually(lambda: worker.runtime.held_leases == 1)
    worker.runtime.request_shutdown()
    await eventually(lambda: service.drains)
    later = await service.add("later")  # not claimed once draining
    assert await worker.exit_code() == EXIT_OK
    assert service.results()[task.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
    assert later.state == "pending"
    assert service.sessions[worker_id] == "stopped"
    assert len(service.drains) == 2 and not service.drains[-1].hand_back


async def test_the_shutdown_grace_hands_unfinished_leases_back(fake: FakeServer) -> None:
    service = fake.service
    slow = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake, shutdown_grace=0.3)
    worker_id = await worker.registered()
    await eventually(lambda: worker.runtime.held_leases == 1)
    assert await worker.stop() == EXIT_OK
    assert [r.dispatch_id for r in service.drains[-1].hand_back] == [slow.dispatch_id]
    assert slow.state == "handed_back"
    assert service.sessions[worker_id] == "stopped"
    assert worker.runtime.metrics.executions.labels("mock", "cancelled")._value.get() == 1


async def test_a_second_shutdown_request_hands_back_at_once(fake: FakeServer) -> None:
    service = fake.service
    slow = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake, shutdown_grace=60.0)
    await eventually(lambda: worker.runtime.held_leases == 1)
    worker.runtime.request_shutdown()
    await eventually(lambda: service.drains)
    worker.runtime.request_shutdown()
    assert await worker.exit_code() == EXIT_OK
    assert slow.state == "handed_back"


async def test_a_failed_final_drain_exits_1(fake: FakeServer) -> None:
    worker = start(fake, rpc_timeout=0.5)
    await worker.registered()
    fake.service.fail("Drain", *[Fault(grpc.StatusCode.PERMISSION_DENIED)] * 2)
    assert await worker.stop() == EXIT_FAILURE


async def test_a_server_gone_mid_drain_is_replaced_by_the_next(fake: FakeServer) -> None:
    # Two servers of one cluster: sessions live in the (here: shared) service state.
    service = fake.service
    other = await start_fake(service)
    try:
        quick = await service.add("quick", {"sleep_ms": 600})
        slow = await service.add("slow", {"sleep_ms": 30_000})
        worker = start(fake, server=f"{fake.address},{other.address}", shutdown_grace=2.0)
        worker_id = await worker.registered()
        await eventually(lambda: worker.runtime.held_leases == 2)
        # The first server stops with the worker, as in a rolling deploy of both.
        await fake.stop()
        assert await worker.stop() == EXIT_OK
        assert worker.runtime.session.address == other.address
        # Finished work was reported and the rest handed back, through the other server.
        assert service.results()[quick.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
        assert slow.state == "handed_back"
        assert service.sessions[worker_id] == "stopped"
    finally:
        await other.stop()


# --- supervision ----------------------------------------------------------------------


class Crash(BaseException):
    """Not an Exception: escapes the executor's error handling, like a bug would."""


class CrashingExecutor:
    async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
        if input.get("crash"):
            raise Crash("bug")
        await asyncio.sleep(30)
        return {}


async def test_an_unexpected_failure_stops_everything_and_hands_back(fake: FakeServer) -> None:
    service = fake.service
    sleeper = await service.add("sleep")
    worker = Running(
        WorkerRuntime(make_config(fake, concurrency=1), executors={"mock": CrashingExecutor()})
    )
    await eventually(lambda: worker.runtime.held_leases == 1)
    await service.add("crash", {"crash": True})
    # Concurrency 1: the crash task is claimed only after the sleeper is gone, so
    # revoke the sleeper to make room.
    service.revoke(sleeper)
    assert await worker.exit_code() == EXIT_FAILURE
    crashed = next(t for t in service.tasks.values() if t.input.get("crash"))
    assert crashed.state == "handed_back"


async def test_executors_can_be_injected(fake: FakeServer) -> None:
    class Constant(MockExecutor):
        async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
            return {"constant": True}

    task = await fake.service.add("x")
    worker = Running(WorkerRuntime(make_config(fake), executors={"mock": Constant()}))
    await eventually(fake.service.results)
    assert output(fake.service.results()[task.dispatch_id]) == {"constant": True}
    assert await worker.stop() == EXIT_OK


def test_every_kind_needs_an_executor() -> None:
    with pytest.raises(ValueError, match="no executor for kind"):
        WorkerRuntime(WorkerConfig(kinds=("mock", "shell")))
