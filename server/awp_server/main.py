"""awp-server entry point."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from prometheus_client import start_http_server

from awp_common import logs
from awp_common.flags import host_port
from awp_db.migrate import migrate_when_reachable
from awp_server import app
from awp_server.config import ServerConfig, parse
from awp_server.credentials import CredentialsInvalid

log = logging.getLogger("awp.server")


async def serve(config: ServerConfig) -> None:
    await migrate_when_reachable(config.database_url)
    if config.metrics_listen:
        host, port = host_port(config.metrics_listen)
        start_http_server(port, addr=host)
    running = await app.start(config)
    host, _ = host_port(config.listen)
    address = f"{host}:{running.port}"
    log.info("awp-server listening", extra={"address": address, "insecure": config.insecure})
    # One plain line on stdout: what scripts and `awp dev` wait for.
    print(f"awp-server listening on {address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if running.credentials is not None:
        loop.add_signal_handler(signal.SIGHUP, running.credentials.reload)
    await stop.wait()
    log.info("awp-server shutting down", extra={"grace_s": config.shutdown_grace_s})
    await running.stop(config.shutdown_grace_s)


def main(argv: Sequence[str] | None = None) -> None:
    config = parse(argv)
    logs.setup(config.log_format, config.log_level)
    try:
        asyncio.run(serve(config))
    except (OSError, CredentialsInvalid) as exc:
        log.error("awp-server cannot start", extra={"error": str(exc)})
        print(f"awp-server: {exc}", file=sys.stderr)
        sys.exit(2)
