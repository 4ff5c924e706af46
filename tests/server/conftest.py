"""Server tests talk to the in-process server through the raw stubs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from awp.v1 import control_pb2_grpc, worker_pb2_grpc
from kit import ServerHandle, Stubs


@pytest.fixture
async def stub(awp_server: ServerHandle) -> AsyncIterator[worker_pb2_grpc.WorkerServiceStub]:
    async with awp_server.channel() as channel:
        yield worker_pb2_grpc.WorkerServiceStub(channel)


@pytest.fixture
async def stubs(awp_server: ServerHandle) -> AsyncIterator[Stubs]:
    """Both services' stubs on one channel."""
    async with awp_server.channel() as channel:
        yield (
            worker_pb2_grpc.WorkerServiceStub(channel),
            control_pb2_grpc.ControlServiceStub(channel),
        )
