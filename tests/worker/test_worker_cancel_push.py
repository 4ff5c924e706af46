"""A revocation reaches the worker at once (docs/design.md, "Cancellation latency"):
CancelRun through one server, and the action running on a worker whose heartbeat stream
is on another server observes its cancellation long before the worker's next heartbeat.

The heartbeat interval is 30 s, so only the server's push can explain a cancellation
seen within the bound below; the bound is far looser than the aim (p50 <= 50 ms, which
bench/ measures: `cancel_latency`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
from runtime_harness import Running

from awp.v1 import control_pb2_grpc, runs_pb2
from awp_coordinator.coordinator import Coordinator
from awp_db import runs
from awp_db.connect import Pool
from awp_sdk.actions import ActionRegistry
from awp_server import metrics as server_metrics
from awp_worker import ActionContext
from awp_worker._config import WorkerConfig
from awp_worker._executors import PythonExecutor
from awp_worker._lifecycle import EXIT_OK
from awp_worker._runtime import WorkerRuntime
from kit import ADMIN, WORKER_TOKEN, ServerHandle, poll_until, spec, start_run

ServerFactory = Callable[..., Awaitable[ServerHandle]]

HEARTBEAT_INTERVAL_S = 30.0
# Far above the aim, far below the heartbeat interval: only a push meets it.
BOUND_S = 5.0


class Observed:
    """What the actions saw, from the action's own thread or task."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled_at: float | None = None


def _registry(observed: Observed) -> ActionRegistry:
    registry = ActionRegistry()

    @registry.action("wait_async")
    async def wait_async(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        observed.started.set()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            observed.cancelled_at = time.monotonic()
            raise
        return {}

    @registry.action("wait_sync")
    def wait_sync(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        observed.started.set()
        # A sync action learns of its cancellation through ctx.cancelled alone.
        while not ctx.cancelled:
            time.sleep(0.002)
        observed.cancelled_at = time.monotonic()
        return {"late": True}

    return registry


async def _servers(start_server: ServerFactory) -> tuple[ServerHandle, ServerHandle]:
    settings = {"heartbeat_interval_s": HEARTBEAT_INTERVAL_S, "lease_ttl_s": 90.0}
    return await start_server(**settings), await start_server(**settings)


def _worker(server: ServerHandle, observed: Observed) -> Running:
    config = WorkerConfig(
        server=server.address,
        worker_token=WORKER_TOKEN,
        name="push-worker",
        kinds=("python",),
        concurrency=2,
        claim_wait=0.5,
        shutdown_grace=10.0,
        safety_margin=0.5,
    )
    executors = {"python": PythonExecutor(_registry(observed))}
    return Running(WorkerRuntime(config, executors=executors), within=30.0)


async def _cancel_and_time(
    control: ServerHandle, worker: Running, observed: Observed, run_id: UUID
) -> float:
    """Cancels the run through `control` once its action runs; the seconds until the
    action observed its cancellation."""

    async def running() -> bool:
        return worker.runtime.held_leases == 1 and observed.started.is_set()

    await poll_until(running, within=20)
    async with control.channel() as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        asked = time.monotonic()
        await stub.CancelRun(
            runs_pb2.CancelRunRequest(run_id=str(run_id), reason="push test"), metadata=ADMIN
        )

    async def seen() -> float | None:
        return observed.cancelled_at

    cancelled_at = await poll_until(seen, within=HEARTBEAT_INTERVAL_S)
    return cancelled_at - asked


@pytest.mark.parametrize("action", ["wait_async", "wait_sync"])
async def test_a_cancel_through_one_server_reaches_a_worker_on_another_at_once(
    start_server: ServerFactory, coordinator: Coordinator, pool: Pool, action: str
) -> None:
    front, back = await _servers(start_server)
    observed = Observed()
    workflow = spec("push", tasks=1, kind="python")
    workflow = replace(workflow, tasks=(replace(workflow.tasks[0], action=action),))
    run_id = await start_run(pool, workflow)
    pushed_before = server_metrics.REVOCATIONS_PUSHED._value.get()
    worker = _worker(back, observed)

    latency = await _cancel_and_time(front, worker, observed, run_id)

    assert latency < BOUND_S, f"cancellation observed {latency:.2f} s after CancelRun"
    assert (await runs.get(pool, run_id)).state == "canceled"
    assert server_metrics.REVOCATIONS_PUSHED._value.get() - pushed_before == 1
    worker_metrics = worker.runtime.metrics
    assert worker_metrics.revocations.labels("revoked")._value.get() == 1
    # Nothing was reported: the sync action's late result is dropped by the worker.
    assert worker_metrics.complete_calls.labels("ok")._value.get() == 0
    assert await worker.stop() == EXIT_OK
