"""``awp-worker``: the worker process (DESIGN.md §8).

Exit codes: 0 drained (or stopped before registering), 1 internal failure or the final
Drain could not be delivered, 2 usage error (bad flag, module not importable), 3 the
session ended permanently (bad worker token, protocol unsupported, session invalid):
the process manager should start it again, and it registers anew.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from awp_common import tracing
from awp_sdk.actions import DEFAULT_REGISTRY
from awp_worker._config import WorkerConfig, parse_config
from awp_worker._diagnostics import collect_stdout
from awp_worker._lifecycle import EXIT_USAGE
from awp_worker._logging import configure
from awp_worker._runtime import WorkerRuntime

log = logging.getLogger("awp_worker")


def import_modules(modules: Sequence[str]) -> None:
    """Import the user modules whose ``@action`` decorators register actions.

    The working directory is importable, as with ``python -m``.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in modules:
        importlib.import_module(name)


async def serve(runtime: WorkerRuntime) -> int:
    """Run ``runtime`` with SIGTERM/SIGINT wired to ``request_shutdown()``."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, runtime.request_shutdown)
    try:
        return await runtime.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def run(config: WorkerConfig) -> int:
    configure(config.log_format, config.log_level)
    collect_stdout()
    try:
        import_modules(config.modules)
    except Exception as exc:
        log.error("cannot import action module: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return EXIT_USAGE
    if "python" in config.kinds:
        if len(DEFAULT_REGISTRY):
            log.info("python actions: %s", ", ".join(DEFAULT_REGISTRY.names()))
        else:
            log.warning(
                "executor kind 'python' has no registered actions: pass --module "
                "(or AWP_WORKER_MODULE) naming the module(s) that define them"
            )
    runtime = WorkerRuntime(config)
    with tracing.process("awp-worker"):
        return asyncio.run(serve(runtime))


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(parse_config(argv)))


if __name__ == "__main__":
    main()
