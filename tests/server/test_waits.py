"""Waits, signals and approvals over real gRPC and PostgreSQL (docs/design.md §16): Await
fenced, SATISFIED or SUSPENDED in one transaction; a suspended attempt frees its lease
and is not charged; SendSignal durable and buffered, consumed once per wait, idempotent
by request id, refused for an ended run; Approve/Reject recorded in the wait's
checkpoint and the run's events; sleeps and wait timeouts released on the database
clock; a canceled run ends its waiting tasks."""

from __future__ import annotations

import asyncio
import json
import time
from uuid import UUID

import pytest
from google.protobuf import duration_pb2, struct_pb2

from awp.v1 import (
    checkpoints_pb2,
    control_pb2,
    control_pb2_grpc,
    durable_pb2,
    runs_pb2,
    session_pb2,
    types_pb2,
    worker_pb2,
)
from awp_db import coordination, waits
from awp_db.connect import Pool
from kit import ADMIN, Stubs, expect_error, spec, start_run
from kit.db import dispatch_all
from kit.invariants import check_committed
from kit.lifecycles import EVENT_LIFECYCLES, illegal_moves, recorded_moves
from kit.rawworker import RawWorker, leased, register

SIGNAL = types_pb2.CHECKPOINT_KIND_SIGNAL
APPROVAL = types_pb2.CHECKPOINT_KIND_APPROVAL
SLEEP = types_pb2.CHECKPOINT_KIND_SLEEP


def millis(ms: int) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromMilliseconds(ms)
    return value


async def wait(
    worker: RawWorker,
    lease: worker_pb2.Lease,
    kind: int,
    name: str = "",
    occurrence: int = 0,
    **fields: object,
) -> checkpoints_pb2.AwaitResponse:
    response: checkpoints_pb2.AwaitResponse = await worker.stub.Await(
        checkpoints_pb2.AwaitRequest(
            session=worker.session,
            dispatch_id=lease.dispatch_id,
            lease_token=lease.lease_token,
            kind=kind,  # type: ignore[arg-type]
            name=name,
            occurrence=occurrence,
            **fields,  # type: ignore[arg-type]
        ),
        timeout=30,
    )
    return response


async def signal(
    control: control_pb2_grpc.ControlServiceStub,
    run_id: UUID,
    name: str,
    payload: object,
    request_id: str = "",
) -> durable_pb2.SendSignalResponse:
    value = struct_pb2.Value()
    value.struct_value.update({"v": payload})
    response: durable_pb2.SendSignalResponse = await control.SendSignal(
        durable_pb2.SendSignalRequest(
            run_id=str(run_id),
            name=name,
            payload=value.struct_value.fields["v"],
            request_id=request_id,
        ),
        metadata=ADMIN,
        timeout=30,
    )
    return response


async def task_of(control: control_pb2_grpc.ControlServiceStub, run_id: UUID) -> runs_pb2.Task:
    run: runs_pb2.GetRunResponse = await control.GetRun(
        runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=ADMIN, timeout=30
    )
    return run.tasks[0]


async def test_a_signal_sent_before_the_wait_is_consumed_when_it_is_reached(
    stubs: Stubs, pool: Pool
) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    first = await signal(control, run_id, "go", {"n": 1}, request_id="r1")
    assert not first.duplicate and first.delivered_to == ""  # buffered: no wait yet
    second = await signal(control, run_id, "go", {"n": 2})
    again = await signal(control, run_id, "go", {"n": 99}, request_id="r1")
    assert again.duplicate and again.signal_id == first.signal_id
    # Each wait consumes one signal, oldest first.
    got = await wait(worker, lease, SIGNAL, "go", 0)
    assert got.outcome == checkpoints_pb2.AWAIT_OUTCOME_SATISFIED
    assert json.loads(got.checkpoint.value_json) == {"n": 1}
    got = await wait(worker, lease, SIGNAL, "go", 1)
    assert json.loads(got.checkpoint.value_json) == {"n": 2}
    # The same wait again (an answer lost) replays its checkpoint, consuming nothing.
    got = await wait(worker, lease, SIGNAL, "go", 1)
    assert json.loads(got.checkpoint.value_json) == {"n": 2}
    assert second.signal_id > first.signal_id
    assert await worker.complete(lease) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    await check_committed(pool)


async def test_a_suspended_attempt_holds_nothing_is_not_charged_and_resumes_on_a_signal(
    stubs: Stubs, pool: Pool
) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1, max_attempts=2))
    got = await wait(worker, lease, SIGNAL, "go", 0, replayed=types_pb2.MemoSavings(steps=1))
    assert got.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED
    task = await task_of(control, run_id)
    assert task.state == types_pb2.TASK_STATE_WAITING and task.suspensions == 1
    assert (task.wait.kind, task.wait.name, task.wait.attempt) == (SIGNAL, "go", 1)
    assert not task.wait.HasField("due_at") and task.saved.steps == 1
    # The lease is over: a late result or another wait is LEASE_LOST, and nothing is
    # leased; the same Await resent (its answer lost) is SUSPENDED again, changing nothing.
    assert await worker.complete(lease) == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
    resent = await wait(worker, lease, SIGNAL, "go", 0)
    assert resent.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED
    assert (await task_of(control, run_id)).suspensions == 1
    for other in ((SIGNAL, "go", 1), (SIGNAL, "other", 0)):
        late = await wait(worker, lease, *other)
        assert late.outcome == checkpoints_pb2.AWAIT_OUTCOME_LEASE_LOST, other
    assert (await check_committed(pool))["leased"] == 0

    sent = await signal(control, run_id, "go", "payload")
    assert sent.delivered_to == task.key
    assert (await task_of(control, run_id)).state == types_pb2.TASK_STATE_READY
    await dispatch_all(pool)
    (lease2,) = await worker.claim(1)
    replayed = await wait(worker, lease2, SIGNAL, "go", 0)
    assert replayed.outcome == checkpoints_pb2.AWAIT_OUTCOME_SATISFIED
    assert json.loads(replayed.checkpoint.value_json) == "payload"
    assert replayed.checkpoint.attempt == 0  # stored by the signal, no attempt running
    # Attempt 2 of 2 fails, retryably: the suspended attempt was free, so one is left.
    await worker.fail(lease2, "boom", retryable=True)
    task = await task_of(control, run_id)
    assert task.state == types_pb2.TASK_STATE_WAITING_RETRY, task
    await check_committed(pool)
    for kind, moves in (await recorded_moves(pool)).items():
        assert illegal_moves(EVENT_LIFECYCLES[kind][0], moves) == [], kind


async def test_a_signal_to_an_ended_or_unknown_run_is_refused(stubs: Stubs, pool: Pool) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    assert await worker.complete(lease) == session_pb2.COMPLETE_OUTCOME_ACCEPTED
    ended = await expect_error(signal(control, run_id, "go", 1))
    assert ended.reason == "RUN_FINISHED" and "has ended (succeeded)" in ended.message
    unknown = await expect_error(signal(control, UUID(int=7), "go", 1))
    assert unknown.reason == "RUN_NOT_FOUND"
    bad = await expect_error(signal(control, run_id, "no spaces", 1))
    assert bad.fields == ["name"]


async def test_a_signal_payload_with_a_number_json_cannot_hold_is_refused(
    stubs: Stubs, pool: Pool
) -> None:
    stub, control = stubs
    run_id, _, _ = await leased(stub, pool, spec(tasks=1))
    for number in (float("nan"), float("inf"), float("-inf")):
        refused = await expect_error(signal(control, run_id, "go", {"n": number}))
        assert refused.reason == "INVALID_ARGUMENT" and refused.fields == ["payload"]
        assert "NaN" in refused.message or "Infinity" in refused.message
    assert await pool.fetchval("SELECT count(*) FROM signals") == 0


async def test_100_concurrent_signals_to_100_waiting_tasks_are_each_consumed_once(
    stubs: Stubs, pool: Pool
) -> None:
    stub, control = stubs
    run_id = await start_run(pool, spec(tasks=100))
    worker = await register(stub, concurrency=100)
    await dispatch_all(pool)
    leases = await worker.claim(100)
    assert len(leases) == 100
    outcomes = await asyncio.gather(*(wait(worker, lease, SIGNAL, "go") for lease in leases))
    assert {o.outcome for o in outcomes} == {checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED}
    sent = await asyncio.gather(*(signal(control, run_id, "go", i) for i in range(100)))
    assert len({s.delivered_to for s in sent}) == 100 and "" not in {s.delivered_to for s in sent}
    async with pool.acquire() as conn:
        consumed = await conn.fetch(
            "SELECT consumed_by_task, count(*) AS n FROM signals WHERE run_id = $1"
            " GROUP BY consumed_by_task",
            run_id,
        )
        stored = await conn.fetchval(
            "SELECT count(*) FROM checkpoints WHERE run_id = $1 AND kind = 'signal'", run_id
        )
    assert len(consumed) == 100 and {row["n"] for row in consumed} == {1}
    assert stored == 100
    await check_committed(pool)


async def test_an_approval_is_decided_once_recorded_and_audited(stubs: Stubs, pool: Pool) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    early = await expect_error(
        control.Approve(
            durable_pb2.ApproveRequest(run_id=str(run_id), task_key="t0"), metadata=ADMIN
        )
    )
    assert early.reason == "NOT_WAITING" and "it is running" in early.message
    got = await wait(worker, lease, APPROVAL, "approval", prompt="Ship it?")
    assert got.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED
    assert (await task_of(control, run_id)).wait.prompt == "Ship it?"
    approved: durable_pb2.ApproveResponse = await control.Approve(
        durable_pb2.ApproveRequest(run_id=str(run_id), task_key="t0", comment="lgtm"),
        metadata=ADMIN,
    )
    assert approved.task_state == types_pb2.TASK_STATE_READY and approved.resumed_attempt == 1
    twice = await expect_error(
        control.Reject(durable_pb2.RejectRequest(run_id=str(run_id), task_key="t0"), metadata=ADMIN)
    )
    assert twice.reason == "NOT_WAITING"
    async with pool.acquire() as conn:
        resumed = await conn.fetch(
            "SELECT payload::text FROM state_events WHERE run_id = $1 AND task_key = 't0'"
            " AND from_state = 'waiting' AND to_state = 'ready'",
            run_id,
        )
    assert len(resumed) == 1
    payload = json.loads(resumed[0]["payload"])
    assert payload["approved"] is True and payload["comment"] == "lgtm"
    assert payload["decided_by"] and payload["resumed_attempt"] == 1
    await dispatch_all(pool)
    (lease2,) = await worker.claim(1)
    decision = await wait(worker, lease2, APPROVAL, "approval", prompt="Ship it?")
    value = json.loads(decision.checkpoint.value_json)
    assert value["approved"] is True and value["comment"] == "lgtm"
    await check_committed(pool)


async def released(pool: Pool, deadline_s: float = 30) -> int:
    """Runs the coordinator's wait timers until one releases a wait."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        async with pool.acquire() as conn:
            moved = await waits.release_due(conn)
        if moved:
            return moved
        await asyncio.sleep(0.05)
    raise AssertionError("no wait came due")


async def test_sleeps_end_and_waits_time_out_on_the_database_clock(
    stubs: Stubs, pool: Pool
) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    now = await wait(worker, lease, SLEEP, "", 0, sleep=millis(0))
    assert now.outcome == checkpoints_pb2.AWAIT_OUTCOME_SATISFIED
    later = await wait(worker, lease, SLEEP, "", 1, sleep=millis(200))
    assert later.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED
    due = (await task_of(control, run_id)).wait
    assert due.due_at.ToMilliseconds() - due.since.ToMilliseconds() == pytest.approx(200, abs=5)
    assert await released(pool) == 1
    await dispatch_all(pool)
    (lease2,) = await worker.claim(1)
    woke = await wait(worker, lease2, SLEEP, "", 1, sleep=millis(200))
    assert woke.outcome == checkpoints_pb2.AWAIT_OUTCOME_SATISFIED and not woke.checkpoint.timed_out
    timeout = await wait(worker, lease2, SIGNAL, "never", timeout=millis(100))
    assert timeout.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED
    assert await released(pool) == 1
    await dispatch_all(pool)
    (lease3,) = await worker.claim(1)
    timed_out = await wait(worker, lease3, SIGNAL, "never", timeout=millis(100))
    assert timed_out.checkpoint.timed_out and timed_out.checkpoint.value_json == "null"
    await check_committed(pool)


async def test_canceling_a_run_ends_its_waiting_task(stubs: Stubs, pool: Pool) -> None:
    stub, control = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    await wait(worker, lease, APPROVAL, "approval", prompt="?")
    await control.CancelRun(runs_pb2.CancelRunRequest(run_id=str(run_id)), metadata=ADMIN)
    async with pool.acquire() as conn:
        await coordination.converge_cancels(conn)
    task = await task_of(control, run_id)
    assert task.state == types_pb2.TASK_STATE_CANCELED and not task.HasField("wait")
    ended = await expect_error(
        control.Approve(
            durable_pb2.ApproveRequest(run_id=str(run_id), task_key="t0"), metadata=ADMIN
        )
    )
    assert ended.reason == "NOT_WAITING"
    await check_committed(pool, finished=True)


def wait_task_workflow(approval: bool) -> types_pb2.WorkflowDefinition:
    """gate (a wait task) -> after (a mock task)."""
    wait = (
        types_pb2.WaitTaskDefinition(
            kind=APPROVAL, prompt="Go on?", timeout=millis(60_000), role="admin"
        )
        if approval
        else types_pb2.WaitTaskDefinition(kind=SLEEP, sleep=millis(100))
    )
    return types_pb2.WorkflowDefinition(
        name="gated",
        version=1,
        tasks=[
            types_pb2.TaskDefinition(key="gate", wait=wait),
            types_pb2.TaskDefinition(
                key="after", executor_kind="mock", action="noop", depends_on=["gate"]
            ),
        ],
    )


async def start_gated(control: control_pb2_grpc.ControlServiceStub, approval: bool) -> UUID:
    await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=wait_task_workflow(approval)),
        metadata=ADMIN,
    )
    started: runs_pb2.StartRunResponse = await control.StartRun(
        runs_pb2.StartRunRequest(workflow_name="gated"), metadata=ADMIN
    )
    return UUID(started.run.id)


async def states(pool: Pool, run_id: UUID) -> dict[str, str]:
    rows = await pool.fetch("SELECT key, state FROM tasks WHERE run_id = $1", run_id)
    return {row["key"]: row["state"] for row in rows}


async def test_an_approval_task_waits_with_no_worker_and_its_decision_ends_it(
    stubs: Stubs, pool: Pool
) -> None:
    _, control = stubs
    run_id = await start_gated(control, approval=True)
    stored: control_pb2.GetWorkflowResponse = await control.GetWorkflow(
        control_pb2.GetWorkflowRequest(name="gated"), metadata=ADMIN
    )
    assert stored.workflow.definition.tasks[0].wait.prompt == "Go on?"
    async with pool.acquire() as conn:
        assert await waits.start_wait_tasks(conn) == 1
    assert await states(pool, run_id) == {"gate": "waiting", "after": "pending"}
    gate = await task_of(control, run_id)
    assert gate.wait.prompt == "Go on?" and gate.wait.role == "admin" and gate.attempts == 0
    approved: durable_pb2.ApproveResponse = await control.Approve(
        durable_pb2.ApproveRequest(run_id=str(run_id), task_key="gate", comment="yes"),
        metadata=ADMIN,
    )
    assert approved.task_state == types_pb2.TASK_STATE_SUCCEEDED
    assert await states(pool, run_id) == {"gate": "succeeded", "after": "ready"}
    output = json.loads(await pool.fetchval("SELECT output::text FROM tasks WHERE key = 'gate'"))
    assert output["approved"] is True and output["comment"] == "yes"
    await check_committed(pool)


async def test_a_rejected_approval_task_fails_the_run_and_a_sleep_task_succeeds(
    stubs: Stubs, pool: Pool
) -> None:
    _, control = stubs
    rejected_run = await start_gated(control, approval=True)
    async with pool.acquire() as conn:
        await waits.start_wait_tasks(conn)
    rejected: durable_pb2.RejectResponse = await control.Reject(
        durable_pb2.RejectRequest(run_id=str(rejected_run), task_key="gate", comment="no"),
        metadata=ADMIN,
    )
    assert rejected.task_state == types_pb2.TASK_STATE_FAILED
    assert await states(pool, rejected_run) == {"gate": "failed", "after": "skipped"}
    assert await pool.fetchval("SELECT state FROM runs WHERE id = $1", rejected_run) == "failed"
    error = json.loads(
        await pool.fetchval(
            "SELECT error::text FROM tasks WHERE run_id = $1 AND key = 'gate'", rejected_run
        )
    )
    assert "rejected by" in error["message"] and error["message"].endswith(": no")

    workflow = wait_task_workflow(approval=False)
    workflow.name = "sleepy"
    await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=workflow), metadata=ADMIN
    )
    started: runs_pb2.StartRunResponse = await control.StartRun(
        runs_pb2.StartRunRequest(workflow_name="sleepy"), metadata=ADMIN
    )
    sleepy = UUID(started.run.id)
    async with pool.acquire() as conn:
        await waits.start_wait_tasks(conn)
    assert await released(pool) == 1
    assert await states(pool, sleepy) == {"gate": "succeeded", "after": "ready"}
    await check_committed(pool)
    # Every move the events recorded is one the lifecycles allow.
    for kind, moves in (await recorded_moves(pool)).items():
        assert illegal_moves(EVENT_LIFECYCLES[kind][0], moves) == [], kind


async def test_a_wait_task_is_validated(stubs: Stubs) -> None:
    _, control = stubs
    workflow = wait_task_workflow(approval=True)
    workflow.tasks[0].executor_kind = "mock"
    workflow.tasks[0].wait.prompt = ""
    bad = await expect_error(
        control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=workflow), metadata=ADMIN
        )
    )
    assert bad.reason == "INVALID_DEFINITION"
    assert set(bad.fields) == {"definition.tasks[0].wait.prompt", "definition.tasks[0].wait"}
