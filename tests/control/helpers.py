"""Building definitions, reading rich errors, and driving runs through the storage layer.

State changes are made the way the coordinator and workers make them (awp_db
functions), so the control plane is observed against real transitions.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any
from uuid import UUID

import grpc
from google.protobuf import duration_pb2, struct_pb2

import support
from awp.v1 import control_pb2, control_pb2_grpc, types_pb2
from awp_db import dispatching, leases, settle, workers
from awp_db.connect import Pool
from awp_db.events import EventBatch
from awp_db.listen import Listener
from awp_server.control_service import ControlService

LEASE_TTL_MS = 60_000


@contextlib.asynccontextmanager
async def control_server(
    pool: Pool, listener: Listener, **options: Any
) -> AsyncIterator[control_pb2_grpc.ControlServiceStub]:
    server = grpc.aio.server()
    control_pb2_grpc.add_ControlServiceServicer_to_server(
        ControlService(pool, listener, **options), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield control_pb2_grpc.ControlServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


# ---------------------------------------------------------------- definitions


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(data)
    return value


def seconds(value: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromMilliseconds(int(value * 1000))
    return duration


def task(
    key: str, depends_on: Sequence[str] = (), *, kind: str = "mock", **fields: Any
) -> types_pb2.TaskDefinition:
    fields.setdefault("action", "test.echo")
    return types_pb2.TaskDefinition(key=key, executor_kind=kind, depends_on=depends_on, **fields)


def definition(
    name: str = "wf",
    version: int = 1,
    tasks: Sequence[types_pb2.TaskDefinition] | None = None,
    **fields: Any,
) -> types_pb2.WorkflowDefinition:
    if tasks is None:
        tasks = [task("a"), task("b", ["a"])]
    return types_pb2.WorkflowDefinition(name=name, version=version, tasks=tasks, **fields)


async def create_workflow(
    stub: control_pb2_grpc.ControlServiceStub, *args: Any, **kwargs: Any
) -> control_pb2.Workflow:
    response = await stub.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=definition(*args, **kwargs))
    )
    return response.workflow


async def start_run(
    stub: control_pb2_grpc.ControlServiceStub, workflow: str = "wf", **fields: Any
) -> control_pb2.Run:
    response = await stub.StartRun(control_pb2.StartRunRequest(workflow_name=workflow, **fields))
    return response.run


# ---------------------------------------------------------------- errors


async def expect_error(
    call: Awaitable[Any],
    code: grpc.StatusCode,
    reason: str,
    field: str | None = None,
) -> support.RichError:
    """Asserts the call fails with this code and reason (and a violation naming field)."""
    error = await support.expect_error(call)
    assert (error.code, error.reason) == (code, reason), error
    if field is not None:
        assert field in error.fields, (field, error.fields)
    return error


# ---------------------------------------------------------------- driving runs


async def register_worker(
    pool: Pool,
    kinds: Sequence[str] = ("mock",),
    *,
    name: str = "worker-1",
    max_concurrency: int = 10,
    labels: dict[str, str] | None = None,
) -> workers.Registration:
    return await workers.register(
        pool, name, 1, list(kinds), max_concurrency, labels or {}, heartbeat_interval_ms=5_000
    )


async def dispatch_and_claim(
    pool: Pool, worker: workers.Registration, max_leases: int = 10
) -> list[leases.IssuedLease]:
    """What the coordinator then a worker do: dispatch ready tasks, lease them."""
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
        return await leases.claim(
            conn, str(worker.worker_id), worker.session_token, max_leases, LEASE_TTL_MS
        )


async def complete(
    pool: Pool,
    worker: workers.Registration,
    issued: Sequence[leases.IssuedLease],
    outcome: str = "succeeded",
) -> None:
    results = [
        leases.ResultIn(
            lease.dispatch_id,
            lease.lease_token,
            outcome,  # type: ignore[arg-type]
            output={"task": lease.task_key, "attempt": lease.attempt},
            error_message="boom" if outcome == "failed" else None,
            retryable=False,
        )
        for lease in issued
    ]
    async with pool.acquire() as conn:
        await leases.complete(conn, str(worker.worker_id), worker.session_token, results)


async def drive_to_end(pool: Pool, run_id: UUID, worker: workers.Registration) -> str:
    """Claims and succeeds every dispatchable task (of any run) until this run finishes."""
    for _ in range(100):
        state = await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
        if state != "running":
            return str(state)
        issued = await dispatch_and_claim(pool, worker)
        assert issued, "a running run with nothing to claim: the test workflow is stuck"
        await complete(pool, worker, issued)
    raise AssertionError("the run did not finish")


async def converge_cancel(pool: Pool, run_id: UUID) -> None:
    """What the coordinator does with a cancel request: stop everything, finish the run."""
    async with pool.acquire() as conn, conn.transaction():
        await settle.lock_runs(conn, [run_id])
        events = EventBatch()
        await settle.stop_runs(conn, [run_id], "canceled", events)
        await settle.finish_runs(conn, [run_id], events)
        await events.flush(conn)
