"""The worker tests' fixtures: a scriptable in-memory WorkerService (worker_fakes), and
the real coordinator for tests against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from worker_fakes import FakeServer, FakeWorkerService, start_fake

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator
from awp_db.connect import Pool


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = await start_fake(FakeWorkerService())
    try:
        yield server
    finally:
        await server.stop()


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
