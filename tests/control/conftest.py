"""A real ControlService on a real gRPC server over a fresh database, per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from awp.v1 import control_pb2_grpc
from awp_db.connect import Pool
from awp_db.listen import Listener
from awp_db.signals import RUN_EVENTS_CHANNEL
from control.helpers import control_server


@pytest.fixture
async def listener(database_dsn: str) -> AsyncIterator[Listener]:
    listener = Listener(database_dsn, [RUN_EVENTS_CHANNEL])
    await listener.start()
    try:
        assert await listener.wait_connected(10), "the listener never connected"
        yield listener
    finally:
        await listener.stop()


@pytest.fixture
async def control(
    pool: Pool, listener: Listener
) -> AsyncIterator[control_pb2_grpc.ControlServiceStub]:
    async with control_server(pool, listener) as stub:
        yield stub
