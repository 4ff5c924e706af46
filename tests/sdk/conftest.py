"""A whole AWP for the SDK's tests: awp-server, the coordinator and a Python worker, in
this test's event loop, over a fresh database. The worker runs what the test modules
registered (the process-wide action registry, as `awp-worker --module` would)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sdk_stack import Stack

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator
from awp_db.connect import Pool
from awp_worker._config import WorkerConfig
from awp_worker._runtime import WorkerRuntime
from kit import WORKER_TOKEN, ServerFactory


@pytest.fixture
async def coordinator(pool: Pool, database_dsn: str) -> AsyncIterator[Coordinator]:
    coord = Coordinator(
        pool,
        CoordinatorConfig(database_url=database_dsn, scan_interval_s=0.1, metrics_listen=None),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(coord.run(stop))
    try:
        yield coord
    finally:
        stop.set()
        async with asyncio.timeout(10):
            await task


@pytest.fixture
async def stack(start_server: ServerFactory, coordinator: Coordinator) -> AsyncIterator[Stack]:
    server = await start_server(heartbeat_interval_s=0.5, lease_ttl_s=3.0)
    runtime = WorkerRuntime(
        WorkerConfig(
            server=server.address,
            worker_token=WORKER_TOKEN,
            name="sdk-test-worker",
            kinds=("mock", "python"),
            concurrency=8,
            claim_wait=0.5,
            reconnect_max=0.2,
            shutdown_grace=5.0,
            safety_margin=0.5,
        )
    )
    worker = asyncio.create_task(runtime.run())
    try:
        async with asyncio.timeout(10):
            await runtime.wait_registered()
        yield Stack(server, start_server)
    finally:
        runtime.request_shutdown()
        runtime.request_shutdown()
        async with asyncio.timeout(30):
            await worker
