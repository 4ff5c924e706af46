"""A worker process killed with SIGKILL while its heartbeat stream is open: the server
ends the stream cleanly, with no task left holding an unretrieved exception."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys

import pytest
from prometheus_client import REGISTRY

from kit import WORKER_TOKEN, ServerHandle, poll_until

# The stream's end races the handler's cancellation: enough kills to lose that race.
KILLS = 10


def streams_open() -> float:
    return REGISTRY.get_sample_value("awp_heartbeat_streams_open") or 0.0


async def test_killed_workers_leave_no_unretrieved_task_exception(
    awp_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    before = streams_open()
    for kill in range(KILLS):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "awp_worker.main",
            "--server", awp_server.address,
            "--worker-token", WORKER_TOKEN,
            "--name", f"killed-{kill}",
            "--kinds", "mock",
            "--metrics-listen", "off",
            env={k: v for k, v in os.environ.items() if not k.startswith("AWP_")},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await poll_until(lambda: streams_open() > before, "the stream to open", within=20)
        finally:
            process.send_signal(signal.SIGKILL)
            await process.wait()
        await poll_until(lambda: streams_open() == before, "the stream to close", within=20)
    # An unretrieved exception is reported when its task is collected.
    gc.collect()
    never = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert never == []
