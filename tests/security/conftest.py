"""Fixtures of the security tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator
from awp_db.connect import Pool


@pytest.fixture
async def coordinator(pool: Pool, database_dsn: str) -> AsyncIterator[None]:
    config = CoordinatorConfig(database_url=database_dsn, scan_interval_s=0.1, metrics_listen=None)
    stop = asyncio.Event()
    task = asyncio.create_task(Coordinator(pool, config).run(stop))
    yield
    stop.set()
    async with asyncio.timeout(10):
        await task
