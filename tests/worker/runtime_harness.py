"""Running a WorkerRuntime in a test: a config against a server, the run as a task,
and the public entry points (register, shut down, exit code) with time limits."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from worker_fakes import TOKEN, FakeServer, Fault

from awp_worker._config import WorkerConfig
from awp_worker._runtime import WorkerRuntime

UNAVAILABLE = Fault(grpc.StatusCode.UNAVAILABLE)


def make_config(fake: FakeServer, **overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "server": fake.address,
        "worker_token": TOKEN,
        "name": "test-worker",
        "kinds": ("mock",),
        "concurrency": 4,
        "claim_wait": 0.3,
        "claim_backoff_initial": 0.01,
        "claim_backoff_max": 0.05,
        "shutdown_grace": 5.0,
        "safety_margin": 0.1,
        "rpc_timeout": 2.0,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)


class Running:
    def __init__(self, runtime: WorkerRuntime, within: float = 20.0) -> None:
        self.runtime = runtime
        self.within = within
        self.task = asyncio.create_task(runtime.run())

    async def registered(self) -> str:
        async with asyncio.timeout(10):
            return await self.runtime.wait_registered()

    async def exit_code(self) -> int:
        async with asyncio.timeout(self.within):
            return await self.task

    async def stop(self) -> int:
        self.runtime.request_shutdown()
        return await self.exit_code()


def start(fake: FakeServer, **overrides: Any) -> Running:
    return Running(WorkerRuntime(make_config(fake, **overrides)))
