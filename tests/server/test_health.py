"""gRPC health follows PostgreSQL: NOT_SERVING while it is unreachable, SERVING again after."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from awp_db.connect import connect
from awp_db.embedded import EmbeddedPostgres
from awp_db.migrate import migrate
from awp_server import app
from awp_server.config import ServerConfig
from kit import poll_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own: stopping it must not disturb other tests."""
    server = EmbeddedPostgres(tmp_path / "pg", unsafe_fast=True).start()
    try:
        yield server
    finally:
        server.stop(mode="immediate")


async def test_health_tracks_the_database(own_postgres: EmbeddedPostgres) -> None:
    conn = await connect(own_postgres.dsn)
    await migrate(conn)
    await conn.close()
    running = await app.start(
        ServerConfig(
            database_url=own_postgres.dsn,
            listen="127.0.0.1:0",
            metrics_listen=None,
            insecure=True,
            health_check_interval_s=0.1,
        )
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def status(service: str = "") -> int:
                response = await health.Check(health_pb2.HealthCheckRequest(service=service))
                return response.status

            def is_(expected: int) -> Callable[[], Awaitable[bool]]:
                async def probe() -> bool:
                    return await status() == expected

                return probe

            await poll_until(is_(SERVING))
            assert await status("awp.v1.WorkerService") == SERVING
            own_postgres.stop(mode="immediate")
            await poll_until(is_(NOT_SERVING))
            assert await status("awp.v1.ControlService") == NOT_SERVING
            own_postgres.start()
            await poll_until(is_(SERVING), within=20)
    finally:
        await running.stop(0)
