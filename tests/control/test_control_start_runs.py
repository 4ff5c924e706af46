"""StartRuns (batch enqueue) over real gRPC and PostgreSQL: many runs in one call and
one transaction, each entry idempotent by its request_id like StartRun, all or nothing,
every error naming its entry; then the runs execute."""

from __future__ import annotations

import grpc

from awp.v1 import control_pb2_grpc, runs_pb2, types_pb2
from awp_db.connect import Pool
from awp_protocol.limits import MAX_START_RUNS
from control.helpers import create_workflow, expect_error, task
from kit.db import drive_to_end, register
from kit.proto import struct

Stub = control_pb2_grpc.ControlServiceStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def entry(request_id: str = "", workflow: str = "wf", **fields: object) -> runs_pb2.StartRunRequest:
    return runs_pb2.StartRunRequest(workflow_name=workflow, request_id=request_id, **fields)  # type: ignore[arg-type]


async def counts(pool: Pool) -> tuple[int, int, int]:
    row = await pool.fetchrow(
        """SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM tasks) AS tasks,
                  (SELECT count(*) FROM state_events) AS events"""
    )
    assert row is not None
    return row["runs"], row["tasks"], row["events"]


async def test_a_thousand_runs_start_in_one_call(control: Stub, pool: Pool) -> None:
    await create_workflow(control, tasks=[task("a"), task("b", ["a"])])
    await create_workflow(control, name="one", tasks=[task("only")])
    request = runs_pb2.StartRunsRequest(
        runs=[
            entry(f"r{i}", "wf" if i % 2 else "one", input=struct({"i": i}))
            for i in range(MAX_START_RUNS)
        ]
    )
    answer = await control.StartRuns(request)
    assert len(answer.runs) == MAX_START_RUNS and all(run.created for run in answer.runs)
    # Each run is exactly what StartRun makes: its tasks, its events.
    assert await counts(pool) == (1000, 1500, 1000 + 1500)
    first = await control.GetRun(runs_pb2.GetRunRequest(run_id=answer.runs[1].run_id))
    assert (first.run.workflow_name, first.run.request_id) == ("wf", "r1")
    assert [t.state for t in first.tasks] == [
        types_pb2.TASK_STATE_READY,
        types_pb2.TASK_STATE_PENDING,
    ]
    # The same call again: the same runs, nothing new.
    again = await control.StartRuns(request)
    assert [r.run_id for r in again.runs] == [r.run_id for r in answer.runs]
    assert not any(run.created for run in again.runs)
    assert await counts(pool) == (1000, 1500, 2500)


async def test_runs_started_together_execute(control: Stub, pool: Pool) -> None:
    await create_workflow(control, tasks=[task("a"), task("b", ["a"])])
    answer = await control.StartRuns(runs_pb2.StartRunsRequest(runs=[entry(), entry()]))
    worker = await register(pool)
    for run in answer.runs:
        assert await drive_to_end(pool, run.run_id, worker) == "succeeded"


async def test_one_bad_entry_refuses_the_call_naming_it(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    cases = [
        ([entry("a"), entry("b", priority=11)], "runs[1].priority"),
        ([entry("a"), entry("b", workflow="missing")], None),
        ([entry("a"), entry("b"), entry("a")], "runs[2].request_id"),
        ([entry("a", workflow="Bad Name")], "runs[0].workflow_name"),
    ]
    for runs, field in cases:
        call = control.StartRuns(runs_pb2.StartRunsRequest(runs=runs))
        if field is None:
            error = await expect_error(call, grpc.StatusCode.NOT_FOUND, "WORKFLOW_NOT_FOUND")
            assert error.message.startswith("runs[1]: "), error.message
        else:
            await expect_error(call, INVALID, "INVALID_ARGUMENT", field)
    await expect_error(
        control.StartRuns(runs_pb2.StartRunsRequest()), INVALID, "INVALID_ARGUMENT", "runs"
    )
    assert await counts(pool) == (0, 0, 0)


async def test_a_request_id_reused_for_another_request_stores_none_of_the_batch(
    control: Stub, pool: Pool
) -> None:
    await create_workflow(control)
    await control.StartRun(entry("taken", input=struct({"n": 1})))
    before = await counts(pool)
    call = control.StartRuns(
        runs_pb2.StartRunsRequest(runs=[entry("new"), entry("taken", input=struct({"n": 2}))])
    )
    error = await expect_error(call, grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_CONFLICT")
    assert error.message.startswith("runs[1]: "), error.message
    assert await counts(pool) == before
    # The same request as before is a retry: its run, beside a new one.
    answer = await control.StartRuns(
        runs_pb2.StartRunsRequest(runs=[entry("new"), entry("taken", input=struct({"n": 1}))])
    )
    assert [run.created for run in answer.runs] == [True, False]
