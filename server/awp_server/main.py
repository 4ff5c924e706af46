"""awp-server entry point (and `awp-server migrate`)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import asyncpg
from prometheus_client import start_http_server

from awp_common import logs, tracing
from awp_common.flags import host_port
from awp_db.connect import Conn
from awp_db.migrate import (
    Migration,
    SchemaError,
    migrate,
    prepare,
    schema_state,
    when_reachable,
)
from awp_db.pooler import PoolerMismatch
from awp_server import app
from awp_server.config import MigrateConfig, ServerConfig, parse, parse_migrate
from awp_server.credentials import CredentialsInvalid

log = logging.getLogger("awp.server")

# Exit codes: the server could not start (or was told not to, by the schema check); a
# migration failed.
EXIT_CANNOT_START = 2
EXIT_MIGRATION_FAILED = 1


async def serve(config: ServerConfig) -> None:
    # Before anything is announced: a SIGTERM right after the listening line (or during
    # the start) is a clean stop, not the default action's abrupt exit.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if not await prepare(config.session_url, migrating=not config.no_migrate, stop=stop):
        log.info("awp-server stopped before it started")
        return
    if config.metrics_listen:
        host, port = host_port(config.metrics_listen)
        start_http_server(port, addr=host)
    running = await app.start(config)
    host, _ = host_port(config.listen)
    address = f"{host}:{running.port}"
    log.info("awp-server listening", extra={"address": address, "insecure": config.insecure})
    # One plain line on stdout: what scripts and `awp dev` wait for.
    print(f"awp-server listening on {address}", flush=True)
    if running.credentials is not None:
        loop.add_signal_handler(signal.SIGHUP, running.credentials.reload)
    await stop.wait()
    log.info("awp-server shutting down", extra={"grace_s": config.shutdown_grace_s})
    await running.stop(config.shutdown_grace_s)


def _say(line: str) -> None:
    print(f"awp-server migrate: {line}", flush=True)


def _applied(migration: Migration, seconds: float) -> None:
    _say(f"applied {migration.version:04d}_{migration.name} ({seconds:.2f} s)")


async def _migrate_step(conn: Conn) -> None:
    before = await schema_state(conn)
    if before.pending:
        _say(
            f"schema at version {before.version}, this build's is {before.needed}: "
            f"applying {len(before.pending)} migration(s)"
        )
    # Under its lock, migrate reads the state again: another migrator may have been first.
    done = await migrate(conn, on_applied=_applied)
    after = await schema_state(conn)
    if after.newer:
        _say(f"schema at version {after.version}, newer than this build's {after.needed}")
    else:
        _say(f"schema at version {after.version}: up to date ({len(done)} applied)")


def migrate_main(argv: Sequence[str]) -> None:
    """awp-server migrate: applies pending migrations, then exits."""
    config: MigrateConfig = parse_migrate(argv)
    logs.setup(config.log_format, config.log_level)
    try:
        asyncio.run(
            when_reachable(
                config.session_url,
                _migrate_step,
                limits=None,
                give_up_after_s=config.give_up_after_s,
            )
        )
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError) as exc:
        log.error("cannot reach the database", extra={"error": str(exc)})
        print(f"awp-server migrate: cannot reach the database: {exc}", file=sys.stderr)
        sys.exit(EXIT_CANNOT_START)
    except SchemaError as exc:
        print(f"awp-server migrate: {exc}", file=sys.stderr)
        sys.exit(EXIT_CANNOT_START)
    except asyncpg.PostgresError as exc:
        log.exception("awp-server migrate failed")
        print(f"awp-server migrate: failed: {exc!r}", file=sys.stderr)
        sys.exit(EXIT_MIGRATION_FAILED)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["migrate"]:
        migrate_main(args[1:])
        return
    config = parse(args)
    logs.setup(config.log_format, config.log_level)
    try:
        with tracing.process("awp-server"):
            asyncio.run(serve(config))
    except (OSError, CredentialsInvalid, SchemaError, PoolerMismatch) as exc:
        log.error("awp-server cannot start", extra={"error": str(exc)})
        print(f"awp-server: {exc}", file=sys.stderr)
        sys.exit(EXIT_CANNOT_START)
