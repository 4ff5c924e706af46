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


async def test_the_probes_port_serves_health_alone(own_postgres: EmbeddedPostgres) -> None:
    """--health-listen: plaintext grpc.health.v1 and nothing else, answering as the main
    port does; awp.liveness stays SERVING while PostgreSQL is away (restarting the server
    would not bring it back), until the server shuts down."""
    conn = await connect(own_postgres.dsn)
    await migrate(conn)
    await conn.close()
    running = await app.start(
        ServerConfig(
            database_url=own_postgres.dsn,
            listen="127.0.0.1:0",
            health_listen="127.0.0.1:0",
            metrics_listen=None,
            insecure=True,
            health_check_interval_s=0.1,
        )
    )
    assert running.health_port not in (0, running.port)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        async def status(service: str = "") -> int:
            response = await health.Check(health_pb2.HealthCheckRequest(service=service))
            return response.status

        try:
            await poll_until(lambda: _is(status(), SERVING), "SERVING on the probes port")
            assert await status(app.LIVENESS_SERVICE) == SERVING
            assert await status("awp.v1.WorkerService") == SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary("/awp.v1.ControlService/ListWorkers")(b"")
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED

            own_postgres.stop(mode="immediate")
            await poll_until(lambda: _is(status(), NOT_SERVING), "NOT_SERVING without PostgreSQL")
            assert await status(app.LIVENESS_SERVICE) == SERVING
        finally:
            await running.stop(0)
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert gone.value.code() == grpc.StatusCode.UNAVAILABLE


async def _is(status: Awaitable[int], expected: int) -> bool:
    return await status == expected
