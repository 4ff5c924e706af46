"""WorkerService tests talk to the in-process server through the raw stubs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from awp.v1 import worker_pb2_grpc
from kit import ServerHandle


@pytest.fixture
async def stub(awp_server: ServerHandle) -> AsyncIterator[worker_pb2_grpc.WorkerServiceStub]:
    async with awp_server.channel() as channel:
        yield worker_pb2_grpc.WorkerServiceStub(channel)
