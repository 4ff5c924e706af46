"""awp-coordinator entry point."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

import asyncpg
from prometheus_client import start_http_server

from awp_common import logs, tracing
from awp_common.flags import host_port
from awp_coordinator import queue_gauges
from awp_coordinator.config import CoordinatorConfig, parse
from awp_coordinator.coordinator import Coordinator
from awp_coordinator.metrics import Metrics
from awp_db import pooler
from awp_db.connect import PoolMode, create_pool
from awp_db.migrate import SchemaError, prepare

log = logging.getLogger("awp.coordinator")


async def serve(config: CoordinatorConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    if not await prepare(config.session_url, migrating=not config.no_migrate, stop=stop):
        log.info("awp-coordinator stopped before it started")
        return

    metrics = Metrics()
    if config.metrics_listen:
        host, port = host_port(config.metrics_listen)
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
        log.info(
            "metrics listening",
            extra={"address": f"{host}:{server.server_port}"},
        )
    await pooler.check_modes(config.database_url, config.session_url, config.database_pool_mode)
    pool = await create_pool(
        config.database_url,
        # No floor: during an outage the pool would log a traceback per retry to keep
        # one; passes open what they need once the database is back.
        min_size=0,
        max_size=config.pool_size,
        application_name=f"awp-coordinator {config.instance}"[:63],
        limits=config.session_limits,
        mode=config.database_pool_mode,
    )
    if config.database_pool_mode is PoolMode.TRANSACTION:
        await pooler.check_limits(pool, config.session_limits)
    log.info(
        "awp-coordinator started",
        extra={
            "instance": config.instance,
            "scan_interval_s": config.scan_interval_s,
            "offline_after_intervals": config.offline_rule.intervals,
            "offline_after_at_least_ms": config.offline_rule.floor_ms,
            "global_dispatch_limit": config.global_dispatch_limit,
            "dispatch_prefetch": config.dispatch_prefetch,
        },
    )
    coordinator = Coordinator(pool, config, metrics)
    gauges = asyncio.create_task(
        queue_gauges.refresh(
            metrics.queue, pool, lambda: coordinator.leading, config.stats_interval_s, stop
        ),
        name="awp-coordinator-gauges",
    )
    try:
        await coordinator.run(stop)
    finally:
        gauges.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gauges
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await pool.close()
    log.info("awp-coordinator stopped", extra={"instance": config.instance})


def main(argv: Sequence[str] | None = None) -> None:
    config = parse(argv)
    logs.setup(config.log_format, config.log_level)
    try:
        with tracing.process("awp-coordinator"):
            asyncio.run(serve(config))
    except (SchemaError, pooler.PoolerMismatch) as exc:
        log.error("awp-coordinator cannot start", extra={"error": str(exc)})
        print(f"awp-coordinator: {exc}", file=sys.stderr)
        sys.exit(2)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.error("awp-coordinator cannot run", extra={"error": repr(exc)})
        sys.exit(2)
