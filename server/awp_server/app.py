"""Assembles awp-server: services, auth, health, reflection, and a clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field

import asyncpg
import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from awp.v1 import control_pb2, control_pb2_grpc, worker_pb2, worker_pb2_grpc
from awp_common.tls import server_credentials
from awp_db import pooler, workers
from awp_db.connect import Pool, PoolMode, create_pool
from awp_db.listen import Listener
from awp_db.signals import (
    COORDINATOR_CHANNEL,
    DISPATCH_CHANNEL,
    LEASE_REVOKED_CHANNEL,
    RUN_EVENTS_CHANNEL,
    STREAM_CHANNEL,
)
from awp_protocol.limits import TRANSPORT_RECEIVE_BYTES
from awp_server import metrics
from awp_server.auth import RoleInterceptor
from awp_server.batch_rpcs import ControlServiceWithBatches
from awp_server.config import ServerConfig
from awp_server.credentials import CredentialStore, shorthand
from awp_server.guard import RequestGuard
from awp_server.observe import MetricsInterceptor
from awp_server.worker_service import WorkerService

log = logging.getLogger("awp.server")

SERVICE_NAMES = (
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    control_pb2.DESCRIPTOR.services_by_name["ControlService"].full_name,
)
# SERVING from start to shutdown, whatever the database's state: what a liveness probe
# asks about (a server cut off from PostgreSQL is not ready, but restarting it cures
# nothing). The other names follow PostgreSQL.
LIVENESS_SERVICE = "awp.liveness"
# grpcio-reflection serves only v1alpha, while grpcurl and Postman ask for v1 first. v1 is
# v1alpha under a new package, field for field, so one servicer answers both.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    pool: Pool
    listener: Listener
    health: health.aio.HealthServicer
    shutting_down: asyncio.Event
    # None without credentials (--insecure).
    credentials: CredentialStore | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The probes' port (--health-listen), when there is one.
    health_server: grpc.aio.Server | None = None
    health_port: int = 0

    async def stop(self, grace: float) -> None:
        """Stops taking calls, lets running ones finish within grace, then releases all."""
        if self.shutting_down.is_set():
            return
        self.shutting_down.set()
        # Parked claims return at once and heartbeat streams end (see WorkerService),
        # so workers move on to the next server instead of waiting out the grace.
        self.listener.wake_all()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.listener.stop()
        await self.pool.close()


async def _set_health(servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICE_NAMES):
        await servicer.set(name, status)


async def _watch_database(
    pool: Pool, servicer: health.aio.HealthServicer, interval_s: float
) -> None:
    """NOT_SERVING while PostgreSQL cannot be reached, SERVING again once it can."""
    serving: bool | None = None
    while True:
        try:
            async with asyncio.timeout(max(interval_s, 1.0) * 2):
                async with pool.acquire() as conn:
                    await conn.fetchval("SELECT 1")
            up = True
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            up = False
        if up != serving:
            serving = up
            await _set_health(servicer, up)
            metrics.DATABASE_UP.set(1 if up else 0)
            log.log(
                logging.INFO if up else logging.WARNING,
                "database reachable" if up else "database unreachable: NOT_SERVING",
            )
        await asyncio.sleep(interval_s)


async def _record_liveness(pool: Pool, interval_s: float) -> None:
    """Tells the coordinator this server serves, every heartbeat interval: a worker's
    silence counts only while some server could have recorded its heartbeat (DESIGN.md
    §7). A write that fails (the database is away) is simply missed; the next one after
    a gap starts a new serving stretch."""
    server_id = uuid.uuid4()
    every_ms = round(interval_s * 1000)
    while True:
        try:
            async with asyncio.timeout(interval_s * workers.SERVER_STALE_AFTER_WRITES):
                await workers.record_liveness(pool, server_id, every_ms)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            log.debug("liveness not recorded", extra={"error": repr(exc)})
        await asyncio.sleep(interval_s)


async def start(config: ServerConfig, pool: Pool | None = None) -> RunningServer:
    """Starts serving on config.listen (port 0 picks a free one); CredentialsInvalid
        before anything starts when the credentials cannot be used, PoolerMismatch when a URL
    leads to another kind of pool than --database-pool-mode says."""
    credentials = None
    if not config.insecure:
        credentials = CredentialStore(
            config.credentials_file, shorthand(config.worker_token, config.admin_token)
        )
    if pool is None:
        await pooler.check_modes(config.database_url, config.session_url, config.database_pool_mode)
        pool = await create_pool(
            config.database_url,
            min_size=0,
            max_size=config.pool_size,
            application_name="awp-server",
            limits=config.session_limits,
            mode=config.database_pool_mode,
        )
        if config.database_pool_mode is PoolMode.TRANSACTION:
            await pooler.check_limits(pool, config.session_limits)
    listener = Listener(
        config.session_url,
        [
            DISPATCH_CHANNEL,
            COORDINATOR_CHANNEL,
            RUN_EVENTS_CHANNEL,
            LEASE_REVOKED_CHANNEL,
            STREAM_CHANNEL,
        ],
    )
    await listener.start()
    shutting_down = asyncio.Event()
    # Metrics first, so that calls refused for a bad token are counted too; the request
    # guard last, so that it wraps the service's own handlers.
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor()]
    if credentials is not None:
        interceptors.append(RoleInterceptor(credentials))
    interceptors.append(RequestGuard())
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", TRANSPORT_RECEIVE_BYTES),
        ],
    )
    worker_service = WorkerService(pool, listener, config, shutting_down)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(worker_service, server)
    control = ControlServiceWithBatches(
        pool, listener, max_stream_readers=config.max_stream_readers
    )
    control_pb2_grpc.add_ControlServiceServicer_to_server(control, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    _enable_reflection(
        server, (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
    )
    await _set_health(health_servicer, False)
    await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    tls = config.tls
    if tls is None:
        port = server.add_insecure_port(config.listen)
    else:
        port = server.add_secure_port(config.listen, server_credentials(tls))
    if port == 0:
        raise OSError(f"could not listen on {config.listen}")
    await server.start()
    running = RunningServer(
        server, port, pool, listener, health_servicer, shutting_down, credentials
    )
    if config.health_listen:
        running.health_server, running.health_port = await _serve_health(
            config.health_listen, health_servicer
        )
    running.tasks.append(
        asyncio.create_task(
            _watch_database(pool, health_servicer, config.health_check_interval_s),
            name="awp-health",
        )
    )
    running.tasks.append(asyncio.create_task(worker_service.revoker.run(), name="awp-revocations"))
    running.tasks.append(
        asyncio.create_task(
            _record_liveness(pool, config.heartbeat_interval_s), name="awp-liveness"
        )
    )
    return running


async def _serve_health(
    listen: str, servicer: health.aio.HealthServicer
) -> tuple[grpc.aio.Server, int]:
    """grpc.health.v1 alone, plaintext and open: it tells only whether this server
    serves, and answers the same as the main port (one servicer behind both)."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"could not listen on {listen} (--health-listen)")
    await server.start()
    log.info("health listening", extra={"address": listen.rpartition(":")[0] + f":{port}"})
    return server, port


def _enable_reflection(server: grpc.aio.Server, services: tuple[str, ...]) -> None:
    """Reflection under both grpc.reflection.v1 and v1alpha, each listing both."""
    _add_reflection_v1_descriptor()
    servicer = reflection.aio.ReflectionServicer(
        (*services, REFLECTION_V1, reflection.SERVICE_NAME)
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1_info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": v1_info}),)
    )


def _add_reflection_v1_descriptor() -> None:
    """Puts grpc/reflection/v1/reflection.proto, derived from v1alpha's, in the default
    pool, so that reflection can describe the v1 service it lists (grpcurl describe)."""
    pool = descriptor_pool.Default()
    v1 = descriptor_pb2.FileDescriptorProto(
        name="grpc/reflection/v1/reflection.proto", package=REFLECTION_V1.rpartition(".")[0]
    )
    with contextlib.suppress(KeyError):
        pool.FindFileByName(v1.name)
        return  # an earlier server of this process added it
    alpha = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(alpha)

    def renamed(type_name: str) -> str:
        return type_name.replace(f".{alpha.package}.", f".{v1.package}.")

    # v1alpha's options are left out: they mark it deprecated, and v1 is current.
    v1.message_type.extend(alpha.message_type)
    v1.service.extend(alpha.service)
    for message in v1.message_type:
        for member in message.field:
            if member.HasField("type_name"):
                member.type_name = renamed(member.type_name)
    for method in v1.service[0].method:
        method.input_type = renamed(method.input_type)
        method.output_type = renamed(method.output_type)
    pool.AddSerializedFile(v1.SerializeToString())
