"""The tests' one kit: polling, rich error details, workflows and runs made through the
db layer, and the in-process server's handle. Larger parts live in its modules:
kit.db (a fake worker over awp_db), kit.rawworker (a worker over the raw stubs),
kit.invariants (what every committed state must satisfy), kit.proto (protobuf values),
kit.strategies (hypothesis JSON values)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import grpc

from awp.v1 import control_pb2_grpc, worker_pb2_grpc
from awp_db import runs, workflows
from awp_db.connect import Pool
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.retry import RetryPolicy
from awp_protocol.errors import decode_details

T = TypeVar("T")


@dataclass
class RichError:
    code: grpc.StatusCode
    reason: str
    message: str
    fields: list[str]


def rich_error(error: grpc.aio.AioRpcError) -> RichError:
    """Decodes google.rpc.ErrorInfo / BadRequest from a failed call's trailers."""
    details = decode_details(error.trailing_metadata())
    return RichError(
        error.code(), details.reason, error.details() or "", [v.field for v in details.violations]
    )


async def expect_error(call: Awaitable[Any]) -> RichError:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return rich_error(error)
    raise AssertionError("the call succeeded but an error was expected")


async def poll_until(
    probe: Callable[[], T | Awaitable[T]],
    what: str = "condition",
    *,
    within: float = 20.0,
    interval: float = 0.01,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """Re-evaluates probe (sync or async) until it is truthy; fails after `within` s.

    Errors of the `tolerate` kinds count as "not yet" (e.g. PostgreSQL restarting).
    """
    deadline = time.monotonic() + within
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
        except tolerate as exc:
            value = exc  # type: ignore[assignment]
        else:
            if value:
                return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {within} s (last value {value!r})")
        await asyncio.sleep(interval)


async def stays(
    probe: Callable[[], Awaitable[bool]], what: str, *, observe_for: float, interval: float = 0.05
) -> None:
    """Asserts probe stays true for a whole observation window.

    Only for proving that something does *not* happen (e.g. no worker, no progress);
    never as a stand-in for waiting on something that should happen.
    """
    deadline = time.monotonic() + observe_for
    while time.monotonic() < deadline:
        if not await probe():
            raise AssertionError(f"{what} stopped holding within {observe_for} s")
        await asyncio.sleep(interval)


def spec(
    name: str = "wf",
    tasks: int = 1,
    *,
    chain: bool = False,
    kind: str = "mock",
    max_attempts: int = 3,
    backoff_ms: int = 0,
    timeout_ms: int = 60_000,
    concurrency: int = 0,
    task_input: dict[str, Any] | None = None,
    depends: dict[int, Sequence[int]] | None = None,
    kinds: dict[int, str] | None = None,
) -> WorkflowSpec:
    """n tasks t0..t(n-1), independent or (chain=True) each depending on the previous;
    `depends` maps a task index to the indexes it waits for, `kinds` to its own kind."""
    if chain:
        depends = {i: [i - 1] for i in range(1, tasks)}
    depends = depends or {}
    kinds = kinds or {}
    retry = RetryPolicy(max_attempts, backoff_ms, max(backoff_ms, 1000), 2.0)
    return validate(
        WorkflowSpec(
            name=name,
            version=1,
            concurrency=concurrency,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind=kinds.get(i, kind),
                    action="noop",
                    input=task_input or {},
                    depends_on=tuple(f"t{d}" for d in depends.get(i, ())),
                    retry=retry,
                    timeout_ms=timeout_ms,
                )
                for i in range(tasks)
            ),
        )
    )


async def start_run(
    pool: Pool,
    workflow: WorkflowSpec,
    request_id: str | None = None,
    run_input: dict[str, Any] | None = None,
) -> UUID:
    stored, _ = await workflows.create(pool, workflow)
    async with pool.acquire() as conn:
        started = await runs.start(conn, stored, run_input or {}, request_id, "test")
    return started.run_id


# --- The in-process server the `start_server` fixture makes -------------------------

WORKER_TOKEN = "test-worker-token"
ADMIN_TOKEN = "test-admin-token"
# The call metadata of an admin's call to the in-process server.
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
# The stubs of both services on one channel (tests/server/conftest.py's `stubs`).
Stubs = tuple[worker_pb2_grpc.WorkerServiceStub, control_pb2_grpc.ControlServiceStub]


@dataclass
class ServerHandle:
    address: str
    config: Any
    running: Any
    dsn: str

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.address)


ServerFactory = Callable[..., Awaitable[ServerHandle]]
