"""StartRun, GetRun, ListRuns, CancelRun over real gRPC and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from uuid import UUID

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from awp.v1 import control_pb2_grpc, runs_pb2, types_pb2
from awp_db import coordination
from awp_db.connect import Pool
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.limits import MAX_INPUT_BYTES
from control.helpers import create_workflow, expect_error, start_run, task, tasks_by_state
from kit import poll_until
from kit.db import converge_cancel, drive_to_end, register
from kit.proto import struct

Stub = control_pb2_grpc.ControlServiceStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def test_start_run_creates_every_task(control: Stub) -> None:
    await create_workflow(control, tasks=[task("a"), task("b", ["a"]), task("c", ["a"])])
    response = await control.StartRun(
        runs_pb2.StartRunRequest(
            workflow_name="wf", input=struct({"who": "me", "n": 3}), request_id="req-1"
        )
    )
    run = response.run
    assert response.created
    UUID(run.id)
    assert (run.workflow_name, run.workflow_version) == ("wf", 1)
    assert run.state == types_pb2.RUN_STATE_RUNNING
    assert run.revision == 1  # one transaction created the run and all its tasks
    assert run.last_seq == 4  # run.created + one task.state per task
    assert tasks_by_state(run) == [
        (types_pb2.TASK_STATE_PENDING, 2),
        (types_pb2.TASK_STATE_READY, 1),
    ]
    assert struct_to_dict(run.input) == {"who": "me", "n": 3}
    assert run.request_id == "req-1"
    assert run.HasField("created_at")
    assert not run.HasField("finished_at")
    assert not run.HasField("cancel_requested_at")


async def test_start_run_is_idempotent_by_request_id(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    request = runs_pb2.StartRunRequest(workflow_name="wf", request_id="once")
    responses = await asyncio.gather(*(control.StartRun(request) for _ in range(10)))
    assert len({r.run.id for r in responses}) == 1
    assert sum(r.created for r in responses) == 1
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1
    # Later retries too, even once a newer version became the latest.
    await create_workflow(control, version=2)
    again = await control.StartRun(request)
    assert (again.run.id, again.created) == (responses[0].run.id, False)
    assert again.run.workflow_version == 1
    # No request id: a new run every time.
    plain = runs_pb2.StartRunRequest(workflow_name="wf")
    first, second = await control.StartRun(plain), await control.StartRun(plain)
    assert first.run.id != second.run.id


async def test_start_run_request_id_reused_for_another_workflow(control: Stub) -> None:
    await create_workflow(control, "one")
    await create_workflow(control, "two")
    await start_run(control, "one", request_id="shared")
    await expect_error(
        control.StartRun(runs_pb2.StartRunRequest(workflow_name="two", request_id="shared")),
        grpc.StatusCode.ALREADY_EXISTS,
        "REQUEST_ID_CONFLICT",
    )


async def test_start_run_request_id_reused_with_another_input_or_version(
    control: Stub, pool: Pool
) -> None:
    """Issue 13: a reused request_id with a different request (input, version, priority)
    is a clear conflict, not silently the original run; the same request (key order, 1
    vs 1.0 aside) still is."""
    await create_workflow(control)
    await create_workflow(control, version=2)
    first = await control.StartRun(
        runs_pb2.StartRunRequest(
            workflow_name="wf", workflow_version=1, input=struct({"a": 1, "b": "x"}),
            request_id="key",
        )
    )  # fmt: skip
    retried = await control.StartRun(
        runs_pb2.StartRunRequest(
            workflow_name="wf", input=struct({"b": "x", "a": 1.0}), request_id="key"
        )
    )
    assert (retried.run.id, retried.created) == (first.run.id, False)
    for other in (
        runs_pb2.StartRunRequest(
            workflow_name="wf", workflow_version=1, input=struct({"a": 2, "b": "x"}),
            request_id="key",
        ),
        runs_pb2.StartRunRequest(workflow_name="wf", input=struct({"a": True, "b": "x"}),
                                    request_id="key"),
        runs_pb2.StartRunRequest(workflow_name="wf", request_id="key"),
        runs_pb2.StartRunRequest(
            workflow_name="wf", workflow_version=2, input=struct({"a": 1, "b": "x"}),
            request_id="key",
        ),
        runs_pb2.StartRunRequest(
            workflow_name="wf", workflow_version=1, input=struct({"a": 1, "b": "x"}),
            request_id="key", priority=3,
        ),
    ):  # fmt: skip
        error = await expect_error(
            control.StartRun(other), grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_CONFLICT"
        )
        assert first.run.id in error.message
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (
            runs_pb2.StartRunRequest(
                workflow_name="wf", input=struct({"blob": "x" * MAX_INPUT_BYTES})
            ),
            "input",
        ),
        (
            runs_pb2.StartRunRequest(workflow_name="wf", input=struct({"x": float("inf")})),
            "input",
        ),
        (runs_pb2.StartRunRequest(workflow_name="wf", input=struct({"k\x00": 1})), "input"),
        (runs_pb2.StartRunRequest(workflow_name="wf", request_id="r" * 129), "request_id"),
        (runs_pb2.StartRunRequest(workflow_name="wf", request_id="a\x00b"), "request_id"),
        (runs_pb2.StartRunRequest(workflow_name=""), "workflow_name"),
        (runs_pb2.StartRunRequest(workflow_name="a/b"), "workflow_name"),
        (
            runs_pb2.StartRunRequest(workflow_name="wf", workflow_version=2**31),
            "workflow_version",
        ),
        (runs_pb2.StartRunRequest(workflow_name="wf", priority=11), "priority"),
        (runs_pb2.StartRunRequest(workflow_name="wf", priority=-11), "priority"),
    ],
)
async def test_start_run_rejects_bad_input(
    control: Stub, pool: Pool, request_: runs_pb2.StartRunRequest, field: str
) -> None:
    await create_workflow(control)
    await expect_error(control.StartRun(request_), INVALID, "INVALID_ARGUMENT", field)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 0


async def test_start_run_accepts_the_largest_input(control: Stub) -> None:
    await create_workflow(control)
    overhead = len('{"blob":""}')
    run = await start_run(control, input=struct({"blob": "x" * (MAX_INPUT_BYTES - overhead)}))
    assert run.state == types_pb2.RUN_STATE_RUNNING


async def test_start_run_of_unknown_workflow(control: Stub) -> None:
    await expect_error(
        control.StartRun(runs_pb2.StartRunRequest(workflow_name="nope")),
        grpc.StatusCode.NOT_FOUND,
        "WORKFLOW_NOT_FOUND",
    )
    await create_workflow(control)
    await expect_error(
        control.StartRun(runs_pb2.StartRunRequest(workflow_name="wf", workflow_version=7)),
        grpc.StatusCode.NOT_FOUND,
        "WORKFLOW_NOT_FOUND",
    )


async def test_get_run_has_tasks_and_attempts(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    run = await start_run(control)
    worker = await register(pool)
    issued = await worker.dispatch_and_claim()
    assert [lease.task_key for lease in issued] == ["a"]

    during = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert [(t.key, t.state) for t in during.tasks] == [
        ("a", types_pb2.TASK_STATE_RUNNING),
        ("b", types_pb2.TASK_STATE_PENDING),
    ]
    (attempt,) = during.attempts
    assert attempt.task_key == "a" and attempt.attempt == 1
    assert attempt.state == types_pb2.ATTEMPT_STATE_RUNNING
    assert attempt.worker_id == str(worker.worker_id)
    assert attempt.dispatch_id == issued[0].dispatch_id
    assert attempt.fencing_token == issued[0].fencing_token
    assert attempt.HasField("deadline") and not attempt.HasField("finished_at")

    await worker.complete_all(issued)
    after = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    a, b = after.tasks
    assert a.state == types_pb2.TASK_STATE_SUCCEEDED
    assert struct_to_dict(a.output) == {"task": "a", "attempt": 1}
    assert a.attempts == 1 and a.max_attempts == 3
    assert a.HasField("finished_at") and not a.HasField("error")
    assert b.state == types_pb2.TASK_STATE_READY and list(b.depends_on) == ["a"]
    assert after.attempts[0].state == types_pb2.ATTEMPT_STATE_SUCCEEDED
    assert tasks_by_state(after.run) == [
        (types_pb2.TASK_STATE_READY, 1),
        (types_pb2.TASK_STATE_SUCCEEDED, 1),
    ]
    assert after.run.revision == 4  # start, dispatch, claim, complete
    assert after.run.last_seq == during.run.last_seq + 3  # attempt, task a, task b ready


async def test_get_run_shows_failures(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    run = await start_run(control)
    worker = await register(pool)
    await worker.complete_all(await worker.dispatch_and_claim(), "failed", retryable=False)
    got = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert got.run.state == types_pb2.RUN_STATE_FAILED
    assert got.run.HasField("finished_at")
    a, b = got.tasks
    assert a.state == types_pb2.TASK_STATE_FAILED
    assert (a.error.message, a.error.retryable) == ("boom", False)
    assert b.state == types_pb2.TASK_STATE_SKIPPED
    assert got.attempts[0].state == types_pb2.ATTEMPT_STATE_FAILED
    assert got.attempts[0].error.message == "boom"


async def test_get_run_errors(control: Stub) -> None:
    await expect_error(
        control.GetRun(runs_pb2.GetRunRequest(run_id=str(uuid.uuid4()))),
        grpc.StatusCode.NOT_FOUND,
        "RUN_NOT_FOUND",
    )
    await expect_error(
        control.GetRun(runs_pb2.GetRunRequest(run_id="not-a-uuid")),
        INVALID,
        "INVALID_ARGUMENT",
        "run_id",
    )


async def list_all(control: Stub, page_size: int, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    token = ""
    while True:
        page = await control.ListRuns(
            runs_pb2.ListRunsRequest(page_size=page_size, page_token=token, **filters)
        )
        pages.append([run.id for run in page.runs])
        token = page.next_page_token
        if not token:
            return pages


async def test_list_runs_newest_first_with_paging(control: Stub, pool: Pool) -> None:
    await create_workflow(control, "one")
    await create_workflow(control, "two")
    ids = {name: [(await start_run(control, name)).id for _ in range(4)] for name in ("one", "two")}
    # Ties on created_at must not lose or repeat a run across pages: id breaks them.
    await pool.execute(
        "UPDATE runs SET created_at = '2030-01-01T00:00:00Z' WHERE id = ANY($1::uuid[])",
        [UUID(i) for i in ids["one"][1:3] + ids["two"][:2]],
    )
    newest_first = [
        str(r["id"])
        for r in await pool.fetch("SELECT id FROM runs ORDER BY created_at DESC, id DESC")
    ]

    pages = await list_all(control, page_size=3)
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [i for p in pages for i in p] == newest_first

    one = [i for p in await list_all(control, 2, workflow_name="one") for i in p]
    assert one == [i for i in newest_first if i in ids["one"]]
    assert [i for p in await list_all(control, 0) for i in p] == newest_first  # default 50

    unknown = await control.ListRuns(runs_pb2.ListRunsRequest(workflow_name="nope"))
    assert list(unknown.runs) == [] and unknown.next_page_token == ""


async def test_list_runs_filters_by_state_and_counts_tasks(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    done = await start_run(control)
    # Driving claims whatever is dispatchable: finish this run before the next starts.
    await drive_to_end(pool, UUID(done.id), await register(pool))
    running = await start_run(control)

    succeeded = await control.ListRuns(
        runs_pb2.ListRunsRequest(state=types_pb2.RUN_STATE_SUCCEEDED)
    )
    assert [r.id for r in succeeded.runs] == [done.id]
    assert tasks_by_state(succeeded.runs[0]) == [(types_pb2.TASK_STATE_SUCCEEDED, 2)]
    still = await control.ListRuns(runs_pb2.ListRunsRequest(state=types_pb2.RUN_STATE_RUNNING))
    assert [r.id for r in still.runs] == [running.id]
    assert tasks_by_state(still.runs[0]) == [
        (types_pb2.TASK_STATE_PENDING, 1),
        (types_pb2.TASK_STATE_READY, 1),
    ]


async def test_list_runs_page_size_is_capped(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    run = await start_run(control)
    # 1,001 runs, cheaply: copies of one run's row (ListRuns reads runs, not tasks).
    await pool.execute(
        "INSERT INTO runs (workflow_id, input) SELECT workflow_id, input FROM runs, "
        "generate_series(1, 1000) WHERE id = $1",
        UUID(run.id),
    )
    page = await control.ListRuns(runs_pb2.ListRunsRequest(page_size=100_000))
    assert len(page.runs) == 1_000 and page.next_page_token
    rest = await control.ListRuns(
        runs_pb2.ListRunsRequest(page_size=100_000, page_token=page.next_page_token)
    )
    assert len(rest.runs) == 1 and rest.next_page_token == ""
    assert len((await control.ListRuns(runs_pb2.ListRunsRequest())).runs) == 50


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (runs_pb2.ListRunsRequest(page_token="%%%"), "page_token"),
        (runs_pb2.ListRunsRequest(page_token="WyJyIiwgMV0"), "page_token"),  # ["r", 1]
        (runs_pb2.ListRunsRequest(page_token="WyJ3IiwgIndmIiwgMV0"), "page_token"),  # ["w", ..]
        (runs_pb2.ListRunsRequest(state=99), "state"),  # type: ignore[arg-type]
        (runs_pb2.ListRunsRequest(workflow_name="x y"), "workflow_name"),
    ],
)
async def test_list_runs_rejects_bad_input(
    control: Stub, request_: runs_pb2.ListRunsRequest, field: str
) -> None:
    await expect_error(control.ListRuns(request_), INVALID, "INVALID_ARGUMENT", field)


async def test_list_runs_rejects_a_forged_timestamp(control: Stub) -> None:
    def token(created_at: str) -> str:
        raw = json.dumps(["r", created_at, str(uuid.uuid4())]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    for bad in ("yesterday", "2030-01-01T00:00:00"):  # no time zone: ambiguous
        await expect_error(
            control.ListRuns(runs_pb2.ListRunsRequest(page_token=token(bad))),
            INVALID,
            "INVALID_ARGUMENT",
            "page_token",
        )


async def test_cancel_run_records_the_intent_once(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    run = await start_run(control)
    canceled = await control.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id, reason="oops"))
    # Only the intent: the coordinator converges it.
    assert canceled.run.state == types_pb2.RUN_STATE_RUNNING
    assert canceled.run.HasField("cancel_requested_at")
    assert canceled.run.revision == run.revision + 1
    assert canceled.run.last_seq == run.last_seq + 1
    event = await pool.fetchrow(
        "SELECT type, payload FROM state_events WHERE run_id = $1 AND seq = $2",
        UUID(run.id),
        canceled.run.last_seq,
    )
    # The caller is recorded too: this servicer runs without credentials.
    assert (event["type"], event["payload"]) == (
        "run.cancel_requested",
        {"reason": "oops", "by": "anonymous"},
    )
    assert canceled.run.cancel_requested_by == "anonymous"

    again = await control.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    assert again.run.revision == canceled.run.revision  # a repeat changes nothing
    assert again.run.cancel_requested_at == canceled.run.cancel_requested_at

    await converge_cancel(pool, UUID(run.id))
    got = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert got.run.state == types_pb2.RUN_STATE_CANCELED
    assert tasks_by_state(got.run) == [(types_pb2.TASK_STATE_CANCELED, 2)]


async def test_cancel_finished_run_is_a_no_op(control: Stub, pool: Pool) -> None:
    await create_workflow(control)
    run = await start_run(control)
    await drive_to_end(pool, UUID(run.id), await register(pool))
    before = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    response = await control.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    assert response.run == before.run
    assert response.run.state == types_pb2.RUN_STATE_SUCCEEDED
    assert not response.run.HasField("cancel_requested_at")


async def test_cancel_run_errors(control: Stub) -> None:
    await expect_error(
        control.CancelRun(runs_pb2.CancelRunRequest(run_id=str(uuid.uuid4()))),
        grpc.StatusCode.NOT_FOUND,
        "RUN_NOT_FOUND",
    )
    await expect_error(
        control.CancelRun(runs_pb2.CancelRunRequest(run_id="123")),
        INVALID,
        "INVALID_ARGUMENT",
        "run_id",
    )
    await create_workflow(control)
    run = await start_run(control)
    for reason in ("nul\x00", "r" * 1025):
        await expect_error(
            control.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id, reason=reason)),
            INVALID,
            "INVALID_ARGUMENT",
            "reason",
        )


async def test_a_task_that_succeeds_on_a_later_attempt_shows_no_error(
    control: Stub, pool: Pool
) -> None:
    """The first attempt's error stays on that attempt; the task, once it succeeded, has
    none (clients show a task's error, and an old one would read as a failure)."""
    retry = types_pb2.RetryPolicy(max_attempts=2, initial_backoff=Duration(nanos=1_000_000))
    await create_workflow(control, tasks=[task("a", retry=retry)])
    run = await start_run(control)
    worker = await register(pool)
    assert await worker.complete_all(await worker.dispatch_and_claim(), "failed") == ["ACCEPTED"]
    waiting = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert waiting.tasks[0].state == types_pb2.TASK_STATE_WAITING_RETRY
    assert waiting.tasks[0].error.message == "boom"  # the latest failure, while it waits

    async def released() -> bool:
        async with pool.acquire() as conn:
            return await coordination.release_retries(conn) == 1

    await poll_until(released, "the retry released", within=10.0)
    assert await worker.complete_all(await worker.dispatch_and_claim()) == ["ACCEPTED"]
    got = await control.GetRun(runs_pb2.GetRunRequest(run_id=run.id))
    assert got.tasks[0].state == types_pb2.TASK_STATE_SUCCEEDED
    assert not got.tasks[0].HasField("error")
    first, second = sorted(got.attempts, key=lambda attempt: attempt.attempt)
    assert first.error.message == "boom"
    assert not second.HasField("error")
