"""The worker tests' fixture: a scriptable in-memory WorkerService (worker_fakes)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from worker_fakes import FakeServer, FakeWorkerService, start_fake


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = await start_fake(FakeWorkerService())
    try:
        yield server
    finally:
        await server.stop()
