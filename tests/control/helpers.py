"""An in-process ControlService, building definitions and reading rich errors.

Runs are driven through the storage layer with the kit (kit.db), the way the
coordinator and workers drive them, so the control plane is observed against real
transitions.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import grpc

import kit
from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_db.connect import Pool
from awp_db.listen import Listener
from awp_server.batch_rpcs import ControlServiceWithBatches
from awp_server.guard import RequestGuard


@contextlib.asynccontextmanager
async def control_server(
    pool: Pool, listener: Listener, **options: Any
) -> AsyncIterator[control_pb2_grpc.ControlServiceStub]:
    async with control_channel(pool, listener, **options) as channel:
        yield control_pb2_grpc.ControlServiceStub(channel)


@contextlib.asynccontextmanager
async def control_channel(
    pool: Pool, listener: Listener, **options: Any
) -> AsyncIterator[grpc.aio.Channel]:
    # The request guard as awp-server installs it: every request is checked before its
    # handler (text, counts, durations, undecodable bytes).
    server = grpc.aio.server(interceptors=[RequestGuard()])
    control_pb2_grpc.add_ControlServiceServicer_to_server(
        ControlServiceWithBatches(pool, listener, **options), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(None)


# ---------------------------------------------------------------- definitions


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
) -> runs_pb2.Run:
    response = await stub.StartRun(runs_pb2.StartRunRequest(workflow_name=workflow, **fields))
    return response.run


# ---------------------------------------------------------------- errors


async def expect_error(
    call: Awaitable[Any],
    code: grpc.StatusCode,
    reason: str,
    field: str | None = None,
) -> kit.RichError:
    """Asserts the call fails with this code and reason (and a violation naming field)."""
    error = await kit.expect_error(call)
    assert (error.code, error.reason) == (code, reason), error
    if field is not None:
        assert field in error.fields, (field, error.fields)
    return error


def tasks_by_state(run: runs_pb2.Run) -> list[tuple[int, int]]:
    """(TaskState, count) pairs in the order the server sends them."""
    return [(c.state, c.count) for c in run.tasks_by_state]
