"""Hostile input to ControlService: undecodable bytes, deep JSON, unbounded text and
counts are refused as INVALID_ARGUMENT / INVALID_DEFINITION naming the field, the error
always fits the call's trailers, and nothing is written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_db.connect import Pool
from awp_db.listen import Listener
from awp_protocol.limits import MAX_DEPENDENCIES, MAX_REPORTED_VIOLATIONS, MAX_TASKS
from control.helpers import control_channel, create_workflow, definition, expect_error, task
from kit.proto import deep_struct_bytes, length_delimited

INVALID = grpc.StatusCode.INVALID_ARGUMENT
ROWS = "SELECT (SELECT count(*) FROM workflows) + (SELECT count(*) FROM runs)"


@pytest.fixture
async def channel(pool: Pool, listener: Listener) -> AsyncIterator[grpc.aio.Channel]:
    async with control_channel(pool, listener) as opened:
        yield opened


@pytest.fixture
def control(channel: grpc.aio.Channel) -> control_pb2_grpc.ControlServiceStub:
    return control_pb2_grpc.ControlServiceStub(channel)


def _raw(channel: grpc.aio.Channel, method: str) -> Any:
    # Bytes sent as they are: no serialiser.
    return channel.unary_unary(f"/awp.v1.ControlService/{method}")


async def test_start_run_with_input_200_deep_is_malformed(
    control: control_pb2_grpc.ControlServiceStub, channel: grpc.aio.Channel, pool: Pool
) -> None:
    await create_workflow(control)
    request = runs_pb2.StartRunRequest(workflow_name="wf").SerializeToString()
    raw = _raw(channel, "StartRun")
    error = await expect_error(
        raw(request + length_delimited(3, deep_struct_bytes(200))),
        INVALID,
        "MALFORMED_REQUEST",
        "input",
    )
    assert "32 levels" in error.message
    assert await pool.fetchval("SELECT count(*) FROM runs") == 0


async def test_create_workflow_with_input_200_deep_is_malformed(
    channel: grpc.aio.Channel, pool: Pool
) -> None:
    valid = definition(tasks=[task("a")])
    task_bytes = valid.tasks[0].SerializeToString() + length_delimited(4, deep_struct_bytes(200))
    valid.ClearField("tasks")
    request = length_delimited(1, valid.SerializeToString() + length_delimited(5, task_bytes))
    await expect_error(
        _raw(channel, "CreateWorkflow")(request),
        INVALID,
        "MALFORMED_REQUEST",
        "definition.tasks[0].input",
    )
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 0


async def test_bytes_that_are_not_protobuf_are_malformed(channel: grpc.aio.Channel) -> None:
    await expect_error(
        _raw(channel, "GetRun")(b"\x0a\xff\xff\xff\x0f"), INVALID, "MALFORMED_REQUEST", "request"
    )
    # A string field that is not UTF-8.
    await expect_error(
        _raw(channel, "GetRun")(b"\x0a\x02\xc3\x28"), INVALID, "MALFORMED_REQUEST", "run_id"
    )


@pytest.mark.parametrize("method", ["GetRun", "CancelRun", "WatchRun"])
async def test_a_20000_character_run_id_gets_its_error(
    control: control_pb2_grpc.ControlServiceStub, method: str
) -> None:
    request = {"run_id": "r" * 20_000}
    call = getattr(control, method)
    message = getattr(runs_pb2, f"{method}Request")(**request)
    answer = call(message)
    if method == "WatchRun":
        answer = _drain(answer)
    error = await expect_error(answer, INVALID, "INVALID_ARGUMENT", "run_id")
    assert len(error.message) < 200


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_a_definition_with_every_task_wrong_reports_the_first_ones(
    control: control_pb2_grpc.ControlServiceStub, pool: Pool
) -> None:
    # 10,000 violations cannot fit an error's trailers: the first ones, and a count.
    tasks = [types_pb2.TaskDefinition(key=f"bad key {i}") for i in range(MAX_TASKS)]
    error = await expect_error(
        control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=definition(tasks=tasks))
        ),
        INVALID,
        "INVALID_DEFINITION",
    )
    assert len(error.fields) == MAX_REPORTED_VIOLATIONS
    assert "more" in error.message
    assert await pool.fetchval(ROWS) == 0


@pytest.mark.parametrize(
    ("tasks", "field"),
    [
        ([task("a", depends_on=["b"] * (MAX_DEPENDENCIES + 1))], "definition.tasks[0].depends_on"),
        ([task("a", depends_on=["x\x00"])], "definition.tasks[0].depends_on[0]"),
        ([task("k" * 20_000)], "definition.tasks[0].key"),
        ([task("a", kind="k\x00")], "definition.tasks[0].executor_kind"),
    ],
    ids=["1001-dependencies", "nul-dependency", "long-key", "nul-kind"],
)
async def test_definition_text_and_counts_are_checked(
    control: control_pb2_grpc.ControlServiceStub,
    pool: Pool,
    tasks: list[types_pb2.TaskDefinition],
    field: str,
) -> None:
    await expect_error(
        control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=definition(tasks=tasks))
        ),
        INVALID,
        "INVALID_DEFINITION",
        field,
    )
    assert await pool.fetchval(ROWS) == 0


async def test_a_long_cycle_is_named_by_its_first_tasks(
    control: control_pb2_grpc.ControlServiceStub,
) -> None:
    keys = [f"t{i}" for i in range(2_000)]
    tasks = [task(key, depends_on=[keys[i - 1]]) for i, key in enumerate(keys)]
    error = await expect_error(
        control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=definition(tasks=tasks))
        ),
        INVALID,
        "INVALID_DEFINITION",
    )
    assert "(2000 tasks)" in error.message
    assert len(error.message) < 500
