"""RetryRun over real gRPC and PostgreSQL: a new run that reuses what succeeded and runs
only what failed or lies downstream, or everything downstream of --from; refused while
the source is live; idempotent by request_id. Runs are driven through the storage layer
(kit.db), as the coordinator and workers drive them."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any
from uuid import UUID

import grpc

from awp.v1 import control_pb2_grpc, runs_pb2, types_pb2
from awp_db import leases
from awp_db.claims import IssuedLease
from awp_db.connect import Pool
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import struct_to_dict
from control.helpers import create_workflow, start_run, task
from kit import expect_error
from kit.db import DbWorker, converge_cancel, register, run_state
from kit.invariants import Expect, check_invariants
from kit.proto import struct

Stub = control_pb2_grpc.ControlServiceStub

# a -> b -> c, and d on its own: b fails, so c is skipped; a and d succeed.
DIAMOND = [task("a"), task("b", ["a"]), task("c", ["b"]), task("d")]


async def drive(
    pool: Pool, worker: DbWorker, run_id: UUID, fail: Collection[str] = ()
) -> list[str]:
    """Claims and completes this run's tasks until it ends (the tasks in `fail` fail for
    good, the others succeed with {"from": <run>, "key": <task>}); the keys executed."""
    executed: list[str] = []
    for _ in range(20):
        if await run_state(pool, run_id) != "running":
            return executed
        leases = await worker.dispatch_and_claim()
        assert leases, "a running run with nothing to claim"
        for lease in leases:
            assert lease.run_id == run_id
            executed.append(lease.task_key)
            if lease.task_key in fail:
                assert await worker.complete(lease, "failed", retryable=False) == "ACCEPTED"
            else:
                result = {"from": str(run_id), "key": lease.task_key, "up": lease.upstream_outputs}
                assert await _succeed(worker, lease, result) == "ACCEPTED"
    raise AssertionError("the run did not finish")


async def _succeed(worker: DbWorker, lease: IssuedLease, output: dict[str, Any]) -> str:
    result = leases.ResultIn(lease.dispatch_id, lease.lease_token, "succeeded", output=output)
    call = leases.Completion(str(worker.id), worker.session_token, [result])
    async with worker.pool.acquire() as conn:
        (verdicts,) = await leases.complete_many(conn, [call])
    assert isinstance(verdicts, list)
    return verdicts[0].name


async def get(control: Stub, run_id: str) -> runs_pb2.GetRunResponse:
    return await control.GetRun(runs_pb2.GetRunRequest(run_id=run_id))


def states(answer: runs_pb2.GetRunResponse) -> dict[str, str]:
    return {
        t.key: types_pb2.TaskState.Name(t.state).removeprefix("TASK_STATE_") for t in answer.tasks
    }


async def failed_run(control: Stub, pool: Pool, worker: DbWorker) -> str:
    await create_workflow(control, tasks=DIAMOND)
    run = await start_run(control, input=struct({"topic": "rivers", "n": 3}))
    assert await drive(pool, worker, UUID(run.id), fail={"b"})
    assert await run_state(pool, UUID(run.id)) == "failed"
    return run.id


async def test_a_retry_reuses_what_succeeded_and_runs_only_the_rest(
    control: Stub, pool: Pool
) -> None:
    worker = await register(pool)
    source_id = await failed_run(control, pool, worker)
    source = await get(control, source_id)
    assert states(source) == {"a": "SUCCEEDED", "b": "FAILED", "c": "SKIPPED", "d": "SUCCEEDED"}

    answer = await control.RetryRun(runs_pb2.RetryRunRequest(run_id=source_id))
    assert answer.created
    new = answer.run
    assert (new.retried_from_run_id, new.retry_from_task) == (source_id, "")
    assert (new.workflow_name, new.workflow_version) == ("wf", 1)
    assert struct_to_dict(new.input) == {"topic": "rivers", "n": 3}
    assert new.state == types_pb2.RUN_STATE_RUNNING

    got = await get(control, new.id)
    assert states(got) == {"a": "SUCCEEDED", "b": "READY", "c": "PENDING", "d": "SUCCEEDED"}
    tasks = {t.key: t for t in got.tasks}
    old = {t.key: t for t in source.tasks}
    for key in ("a", "d"):
        assert tasks[key].reused_from_run_id == source_id
        assert tasks[key].attempts == 0
        assert tasks[key].output == old[key].output
    assert not tasks["b"].reused_from_run_id and not got.attempts

    # Only b and then c run; b receives a's output exactly as before.
    executed = await drive(pool, worker, UUID(new.id))
    assert executed == ["b", "c"]
    done = await get(control, new.id)
    assert done.run.state == types_pb2.RUN_STATE_SUCCEEDED
    b_output = struct_to_dict({t.key: t for t in done.tasks}["b"].output)
    assert b_output["up"] == {"a": struct_to_dict(old["a"].output)}
    await check_invariants(
        pool, {UUID(source_id): Expect("failed", {"b": "failed", "c": "skipped"}, "succeeded"),
               UUID(new.id): Expect()}
    )  # fmt: skip

    # The events say where the run and its reused tasks came from.
    created = await pool.fetch(
        "SELECT task_key, to_state, payload FROM state_events WHERE run_id = $1 AND revision = 1"
        " ORDER BY seq",
        UUID(new.id),
    )
    assert created[0]["payload"]["retried_from"] == source_id
    reused = {e["task_key"]: e["payload"].get("reused_from") for e in created[1:]}
    assert reused == {"a": source_id, "b": None, "c": None, "d": source_id}


async def test_a_chain_of_retries_reuses_transitively(control: Stub, pool: Pool) -> None:
    worker = await register(pool)
    first = await failed_run(control, pool, worker)
    second = (await control.RetryRun(runs_pb2.RetryRunRequest(run_id=first))).run.id
    assert await drive(pool, worker, UUID(second), fail={"c"}) == ["b", "c"]
    third = (await control.RetryRun(runs_pb2.RetryRunRequest(run_id=second))).run
    assert third.retried_from_run_id == second
    tasks = {t.key: t for t in (await get(control, third.id)).tasks}
    # Each reused output names the run whose attempt produced it.
    assert {k: t.reused_from_run_id for k, t in tasks.items()} == {
        "a": first,
        "b": second,
        "c": "",
        "d": first,
    }
    assert await drive(pool, worker, UUID(third.id)) == ["c"]
    await check_invariants(pool, {UUID(third.id): Expect()})


async def test_from_task_reruns_that_task_and_everything_downstream(
    control: Stub, pool: Pool
) -> None:
    worker = await register(pool)
    await create_workflow(control, tasks=DIAMOND)
    run = await start_run(control)
    await drive(pool, worker, UUID(run.id))
    retried = await control.RetryRun(runs_pb2.RetryRunRequest(run_id=run.id, from_task="b"))
    assert retried.run.retry_from_task == "b"
    got = await get(control, retried.run.id)
    assert states(got) == {"a": "SUCCEEDED", "b": "READY", "c": "PENDING", "d": "SUCCEEDED"}
    assert await drive(pool, worker, UUID(retried.run.id)) == ["b", "c"]


async def test_a_retry_with_nothing_to_run_has_succeeded_at_once(control: Stub, pool: Pool) -> None:
    worker = await register(pool)
    await create_workflow(control, tasks=DIAMOND)
    run = await start_run(control)
    await drive(pool, worker, UUID(run.id))
    retried = (await control.RetryRun(runs_pb2.RetryRunRequest(run_id=run.id))).run
    assert retried.state == types_pb2.RUN_STATE_SUCCEEDED
    assert retried.HasField("finished_at")
    assert [(c.state, c.count) for c in retried.tasks_by_state] == [
        (types_pb2.TASK_STATE_SUCCEEDED, 4)
    ]
    await check_invariants(pool, {UUID(retried.id): Expect()})


async def test_a_canceled_run_reruns_its_canceled_tasks(control: Stub, pool: Pool) -> None:
    worker = await register(pool)
    await create_workflow(control, tasks=[task("a"), task("b", ["a"])])
    run = await start_run(control)
    (lease,) = await worker.dispatch_and_claim()
    assert await _succeed(worker, lease, {"ok": True}) == "ACCEPTED"
    await control.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    await converge_cancel(pool, UUID(run.id))
    assert states(await get(control, run.id)) == {"a": "SUCCEEDED", "b": "CANCELED"}
    retried = (await control.RetryRun(runs_pb2.RetryRunRequest(run_id=run.id))).run
    assert await drive(pool, worker, UUID(retried.id)) == ["b"]


async def test_a_live_run_cannot_be_retried(control: Stub, pool: Pool) -> None:
    await create_workflow(control, tasks=DIAMOND)
    run = await start_run(control)
    error = await expect_error(control.RetryRun(runs_pb2.RetryRunRequest(run_id=run.id)))
    assert (error.code, error.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        Reason.RUN_NOT_FINISHED,
    )
    assert "still running" in error.message and "cancel it first" in error.message
    await control.CancelRun(runs_pb2.CancelRunRequest(run_id=run.id))
    canceling = await expect_error(control.RetryRun(runs_pb2.RetryRunRequest(run_id=run.id)))
    assert canceling.reason == Reason.RUN_NOT_FINISHED and "still canceling" in canceling.message
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1


async def test_bad_retry_requests_name_their_field(control: Stub, pool: Pool) -> None:
    worker = await register(pool)
    source_id = await failed_run(control, pool, worker)
    unknown = await expect_error(
        control.RetryRun(runs_pb2.RetryRunRequest(run_id=source_id, from_task="nope"))
    )
    assert (unknown.code, unknown.reason, unknown.fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.INVALID_ARGUMENT,
        ["from_task"],
    )
    assert "has no task 'nope'" in unknown.message
    malformed = await expect_error(
        control.RetryRun(runs_pb2.RetryRunRequest(run_id=source_id, from_task="a b"))
    )
    assert malformed.fields == ["from_task"]
    not_a_run = await expect_error(control.RetryRun(runs_pb2.RetryRunRequest(run_id="x")))
    assert not_a_run.fields == ["run_id"]
    missing = await expect_error(
        control.RetryRun(runs_pb2.RetryRunRequest(run_id=str(UUID(int=7))))
    )
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, Reason.RUN_NOT_FOUND)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1


async def test_retry_is_idempotent_by_request_id(control: Stub, pool: Pool) -> None:
    worker = await register(pool)
    source_id = await failed_run(control, pool, worker)
    request = runs_pb2.RetryRunRequest(run_id=source_id, request_id="retry-once")
    answers = await asyncio.gather(*(control.RetryRun(request) for _ in range(8)))
    assert len({a.run.id for a in answers}) == 1
    assert sum(a.created for a in answers) == 1
    assert await pool.fetchval("SELECT count(*) FROM runs") == 2
    # Later, even once that retry has finished.
    await drive(pool, worker, UUID(answers[0].run.id))
    again = await control.RetryRun(request)
    assert (again.run.id, again.created) == (answers[0].run.id, False)

    # The same key for another request is a conflict naming the run it started.
    for other in (
        runs_pb2.RetryRunRequest(run_id=source_id, from_task="a", request_id="retry-once"),
        runs_pb2.RetryRunRequest(run_id=again.run.id, request_id="retry-once"),
    ):
        conflict = await expect_error(control.RetryRun(other))
        assert (conflict.code, conflict.reason) == (
            grpc.StatusCode.ALREADY_EXISTS,
            Reason.REQUEST_ID_CONFLICT,
        )
        assert again.run.id in conflict.message
    # A StartRun of the very workflow and input the retry has is no repeat of it either.
    same = runs_pb2.StartRunRequest(
        workflow_name="wf", input=struct({"topic": "rivers", "n": 3}), request_id="retry-once"
    )
    started = await expect_error(control.StartRun(same))
    assert started.reason == Reason.REQUEST_ID_CONFLICT
    assert await pool.fetchval("SELECT count(*) FROM runs") == 2


async def test_a_retry_of_a_map_workflow_starts_its_map_from_the_reused_upstream(
    control: Stub, pool: Pool
) -> None:
    """plan is reused; the map task over its output starts in the retry's own creating
    transaction (its elements ready), and the always task runs again at the end."""
    await create_workflow(
        control,
        tasks=[
            task("plan"),
            task("search", ["plan"], map=types_pb2.TaskMap(over="plan", path="queries")),
            task("cleanup", ["search"], always=True),
        ],
    )
    worker = await register(pool, max_concurrency=20)
    run = await start_run(control)
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": ["x", "y", "z"]})
    elements = await worker.dispatch_and_claim()
    await worker.complete_all(elements[:2])
    await worker.complete(elements[2], "failed", retryable=False)
    (cleanup,) = await worker.dispatch_and_claim()
    await worker.complete(cleanup)
    assert await run_state(pool, UUID(run.id)) == "failed"

    retried = (await control.RetryRun(runs_pb2.RetryRunRequest(run_id=run.id))).run
    answer = await get(control, retried.id)
    assert states(answer) == {
        "plan": "SUCCEEDED",
        "search": "RUNNING",
        "cleanup": "PENDING",
        "search[0]": "READY",
        "search[1]": "READY",
        "search[2]": "READY",
    }
    executed = await drive(pool, worker, UUID(retried.id))
    assert sorted(executed) == ["cleanup", "search[0]", "search[1]", "search[2]"]
    assert await run_state(pool, UUID(retried.id)) == "succeeded"
    await check_invariants(pool, {UUID(retried.id): Expect()})
