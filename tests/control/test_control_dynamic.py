"""Dynamic work over real gRPC and PostgreSQL: map, on_failure and always in
CreateWorkflow / GetWorkflow, refused definitions naming their fields, GetRun listing a
map task's elements, and the states an always task's lease carries (WorkerService)."""

from __future__ import annotations

import grpc

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2, worker_pb2_grpc
from awp_db.connect import Pool
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.limits import MAX_MAP_ELEMENTS
from control.helpers import create_workflow, expect_error, start_run, task
from kit import ServerHandle
from kit.db import dispatch_all, register
from kit.rawworker import register as register_raw

Stub = control_pb2_grpc.ControlServiceStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def research() -> list[types_pb2.TaskDefinition]:
    return [
        task("plan"),
        task(
            "search",
            ["plan"],
            map=types_pb2.TaskMap(over="plan", path="queries"),
            on_failure=types_pb2.FAILURE_POLICY_CONTINUE,
        ),
        task("summarize", ["search"]),
        task("cleanup", ["summarize"], always=True),
    ]


async def test_dynamic_fields_round_trip(control: Stub) -> None:
    created = await create_workflow(control, tasks=research())
    got = await control.GetWorkflow(control_pb2.GetWorkflowRequest(name="wf"))
    for definition in (created.definition, got.workflow.definition):
        plan, search, summarize, cleanup = definition.tasks
        assert not plan.HasField("map") and plan.on_failure == types_pb2.FAILURE_POLICY_FAIL_RUN
        assert (search.map.over, search.map.path) == ("plan", "queries")
        assert search.on_failure == types_pb2.FAILURE_POLICY_CONTINUE
        assert cleanup.always and not summarize.always
    # The stored definition spelled out is the same definition: re-creating it is a no-op.
    again = await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=got.workflow.definition)
    )
    assert not again.created


async def test_refused_dynamic_definitions_name_their_fields(control: Stub) -> None:
    error = await expect_error(
        create_workflow(
            control,
            tasks=[
                task("plan"),
                task("search", [], map=types_pb2.TaskMap(over="plan", path="a..b")),
                task("cleanup", always=True, on_failure=types_pb2.FAILURE_POLICY_CONTINUE),
                task("after", ["cleanup"]),
                task("odd", on_failure=7),  # type: ignore[arg-type]
            ],
        ),
        INVALID,
        "INVALID_DEFINITION",
    )
    assert error.fields == [
        "definition.tasks[1].map.over",
        "definition.tasks[1].map.path",
        "definition.tasks[2].on_failure",
        "definition.tasks[3].depends_on[0]",
        "definition.tasks[4].on_failure",
    ]


async def test_a_path_longer_than_its_limit_is_refused_before_the_handler(control: Stub) -> None:
    error = await expect_error(
        create_workflow(
            control,
            tasks=[
                task("plan"),
                task("s", ["plan"], map=types_pb2.TaskMap(over="plan", path="a" * 257)),
            ],
        ),
        INVALID,
        "INVALID_DEFINITION",
        "definition.tasks[1].map.path",
    )
    assert "at most 256 characters" in error.message


async def test_get_run_lists_a_map_tasks_elements(control: Stub, pool: Pool) -> None:
    await create_workflow(control, tasks=research())
    run = await start_run(control)
    worker = await register(pool)
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": ["x", "y", "z"]})
    answer = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    tasks = [(t.key, t.state, t.map_parent, t.map_index) for t in answer.tasks]
    assert tasks == [
        ("plan", types_pb2.TASK_STATE_SUCCEEDED, "", 0),
        ("search", types_pb2.TASK_STATE_RUNNING, "", 0),
        ("summarize", types_pb2.TASK_STATE_PENDING, "", 0),
        ("cleanup", types_pb2.TASK_STATE_PENDING, "", 0),
        ("search[0]", types_pb2.TASK_STATE_READY, "search", 0),
        ("search[1]", types_pb2.TASK_STATE_READY, "search", 1),
        ("search[2]", types_pb2.TASK_STATE_READY, "search", 2),
    ]
    counts = {c.state: c.count for c in answer.run.tasks_by_state}
    assert counts[types_pb2.TASK_STATE_READY] == 3


async def test_a_too_wide_list_is_stored_as_the_map_tasks_error(control: Stub, pool: Pool) -> None:
    await create_workflow(control, tasks=research())
    run = await start_run(control)
    worker = await register(pool)
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": list(range(MAX_MAP_ELEMENTS + 5))})
    answer = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    search = next(t for t in answer.tasks if t.key == "search")
    assert search.state == types_pb2.TASK_STATE_FAILED
    assert search.error.message == (
        "map over 'plan': the value at 'queries' in its output has 1005 elements; "
        "a map task takes at most 1000"
    )
    assert not search.error.retryable
    # on_failure continue: its downstream is skipped, the always task's turn has come.
    states = {t.key: t.state for t in answer.tasks}
    assert states["summarize"] == types_pb2.TASK_STATE_SKIPPED
    assert states["cleanup"] == types_pb2.TASK_STATE_READY


async def test_an_always_task_lease_carries_its_dependencies_states(
    awp_server: ServerHandle, pool: Pool
) -> None:
    async with awp_server.channel() as channel:
        control = control_pb2_grpc.ControlServiceStub(channel)
        metadata = (("authorization", "Bearer test-admin-token"),)
        flow = types_pb2.WorkflowDefinition(
            name="notify",
            version=1,
            tasks=[task("work"), task("notify", ["work"], always=True)],
        )
        await control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=flow), metadata=metadata
        )
        await control.StartRun(runs_pb2.StartRunRequest(workflow_name="notify"), metadata=metadata)
        worker = await register_raw(worker_pb2_grpc.WorkerServiceStub(channel))
        await dispatch_all(pool)
        (work,) = await worker.claim()
        await worker.fail(work, "no luck", retryable=False)
        await dispatch_all(pool)
        (notify,) = await worker.claim()
        assert notify.task_key == "notify"
        assert dict(notify.upstream_states) == {"work": types_pb2.TASK_STATE_FAILED}
        assert struct_to_dict(notify.upstream_outputs["work"]) == {}
