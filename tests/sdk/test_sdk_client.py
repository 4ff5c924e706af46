"""The SDK's client against a real awp-server, coordinator and Python worker: apply,
start, result, typed errors, paging, cancel, exact integers, and the sync Client."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import sdk_flows
from sdk_stack import Stack

from awp.v1 import control_pb2, control_pb2_grpc
from awp_protocol.errors import Reason, decode_details
from awp_protocol.limits import MAX_EXACT_INT
from awp_sdk import (
    AsyncClient,
    Client,
    DefinitionConflict,
    DefinitionInvalid,
    InvalidArgument,
    RunCanceled,
    RunFailed,
    RunNotFound,
    Unauthenticated,
    Unavailable,
    Workflow,
    WorkflowNotFound,
)
from awp_sdk.client import definition_of
from kit import ADMIN_TOKEN, poll_until


async def test_a_workflow_in_code_runs_and_its_integers_come_back_exact(stack: Stack) -> None:
    values = [1, -3, 2**40, MAX_EXACT_INT // 4]
    edge = [MAX_EXACT_INT, -MAX_EXACT_INT, 0.5, 1e300]
    async with stack.client() as client:
        applied = await client.apply(sdk_flows.numbers)
        assert (applied.name, applied.version, applied.created) == ("sdk-numbers", 1, True)
        assert (await client.apply(sdk_flows.numbers)).created is False
        run = await client.start(sdk_flows.numbers, input={"values": values, "edge": edge})
        outputs = await run.result(timeout=60)
    assert outputs["double"] == {"doubled": [2 * v for v in values], "attempt": 1, "edge": edge}
    assert [type(v) for v in outputs["double"]["edge"]] == [int, int, float, float]
    assert outputs["total"] == {"sum": 2 * sum(values), "types": ["int"]}
    assert all(type(v) is int for v in outputs["double"]["doubled"])
    detail = await run.get()
    assert detail.run.input == {"values": values, "edge": edge}
    assert type(detail.run.input["values"][2]) is int


async def test_integers_beyond_2_53_are_refused_not_rounded(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.numbers)
        with pytest.raises(InvalidArgument) as refused:
            await client.start(sdk_flows.numbers, input={"values": [1, 2, MAX_EXACT_INT + 1]})
        assert refused.value.violations[0].field == "input.values[2]"
        assert "2**53" in refused.value.violations[0].description
        assert [r async for r in client.list_runs(workflow="sdk-numbers")] == []
        # An action returning one fails its attempt for good instead of reporting it rounded.
        await client.apply(sdk_flows.overflow)
        run = await client.start(sdk_flows.overflow)
        with pytest.raises(RunFailed) as failed:
            await run.result(timeout=60)
    assert failed.value.task_key == "too_big"
    assert failed.value.retryable is False
    assert f"the integer {MAX_EXACT_INT + 1} is outside" in (failed.value.error or "")


async def test_result_raises_with_the_failed_task_and_its_error(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.broken)
        run = await client.start(sdk_flows.broken, input={"key": "missing"})
        with pytest.raises(RunFailed) as failed:
            await run.result(timeout=60)
        error = failed.value
        assert (error.run_id, error.task_key, error.attempt) == (run.id, "lookup", 2)
        assert error.error == "KeyError: 'missing'" and error.retryable is True
        assert "task 'lookup' failed after 2 attempts: KeyError: 'missing'" in str(error)
        assert error.error_type == "KeyError"
        # The traceback starts at the action's own frame: the line that raised is in it.
        assert error.traceback is not None and "sdk_flows.py" in error.traceback
        assert 'table[ctx.run_input["key"]]' in error.traceback
        detail = await run.get()
        assert detail.tasks["after"].state == "skipped"

        await client.apply(sdk_flows.final)
        with pytest.raises(RunFailed) as final:
            await (await client.start(sdk_flows.final)).result(timeout=60)
        assert (final.value.task_key, final.value.attempt) == ("refuse", 1)
        assert (final.value.error, final.value.retryable) == ("no such customer", False)


async def test_list_runs_pages_through_every_run_once(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.steps)
        started = [(await client.start(sdk_flows.steps)).id for _ in range(5)]
        listed = [run.id async for run in client.list_runs(workflow="sdk-steps", page_size=2)]
        assert listed == started[::-1]  # newest first, each once, across three pages
        for run_id in started:
            assert await client.run(run_id).result(timeout=60)
        succeeded = [r async for r in client.list_runs(state="succeeded", page_size=2)]
        assert sorted(r.id for r in succeeded) == sorted(started)
        assert {r.task_counts["succeeded"] for r in succeeded} == {3}
        # Every task of a run, in the run's order, through ListTasks' pages.
        tasks = [t async for t in client.list_tasks(started[0])]
        assert [(t.key, t.state) for t in tasks] == [
            ("first", "succeeded"),
            ("second", "succeeded"),
            ("third", "succeeded"),
        ]
        assert (await client.get_run(started[0])).tasks_omitted == 0


async def test_cancel_ends_a_run_and_result_says_so(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.slow)
        run = await client.start(sdk_flows.slow, input={"seconds": 60})

        async def running() -> bool:
            return (await run.get()).tasks["wait"].state == "running"

        await poll_until(running, "the task to run")
        asked = await run.cancel("not needed")
        assert asked.cancel_requested_at is not None
        with pytest.raises(RunCanceled):
            await run.result(timeout=60)
        assert (await run.get()).run.state == "canceled"


async def test_errors_are_typed_by_the_servers_reason(stack: Stack) -> None:
    async with stack.client() as client:
        with pytest.raises(RunNotFound) as missing:
            await client.get_run("00000000-0000-0000-0000-000000000000")
        assert missing.value.reason == Reason.RUN_NOT_FOUND
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(WorkflowNotFound):
            await client.start("no-such-workflow")
        await client.apply(sdk_flows.final)
        changed = Workflow("sdk-final", version=1)
        changed.add("other", kind="mock", action="sdk.other")
        with pytest.raises(DefinitionConflict) as conflict:
            await client.apply(changed)
        assert conflict.value.reason == Reason.DEFINITION_CONFLICT
    async with AsyncClient(stack.address, token="wrong") as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.get_run("00000000-0000-0000-0000-000000000000")


async def test_an_unreachable_server_says_where_and_how_to_start_one(stack: Stack) -> None:
    address = stack.address
    await stack.server.running.stop(0)
    async with AsyncClient(address, token=ADMIN_TOKEN, timeout=5) as client:
        with pytest.raises(Unavailable) as unreachable:
            await client.get_run("00000000-0000-0000-0000-000000000000")
    assert str(unreachable.value).startswith(f"cannot reach awp-server at {address}: ")
    assert "awp dev" in str(unreachable.value)


async def test_definitions_are_refused_locally_with_the_servers_own_words(stack: Stack) -> None:
    bad = Workflow("sdk bad", version=1)  # a space: not a valid name
    a = bad.add("a", kind="mock", action="sdk.a")
    bad.add("a", kind="rust", action="sdk.a", depends_on=[a], timeout="1ms")
    with pytest.raises(DefinitionInvalid) as local:
        definition_of(bad)
    # The server, sent the same definition, names the same fields with the same words.
    async with stack.client() as client:
        stub: control_pb2_grpc.ControlServiceAsyncStub = client.control
        try:
            await stub.CreateWorkflow(
                control_pb2.CreateWorkflowRequest(definition=bad_definition(bad)),
                metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),),
            )
        except grpc.aio.AioRpcError as error:
            server = decode_details(error.trailing_metadata())
        else:
            raise AssertionError("the server accepted an invalid definition")
    assert server.reason == local.value.reason == Reason.INVALID_DEFINITION
    assert local.value.violations == server.violations
    fields = {v.field for v in local.value.violations}
    assert {"definition.name", "definition.tasks[1].key", "definition.tasks[1].timeout"} <= fields


def bad_definition(workflow: Workflow) -> object:
    from awp_sdk import definitions  # noqa: PLC0415 (only this test bypasses the check)

    return definitions.definition(workflow.to_dict())


def test_dependencies_are_tasks_not_names() -> None:
    wf = Workflow("sdk-refs", version=1)
    first = wf.add("first", kind="mock", action="sdk.a")
    other = Workflow("sdk-other", version=1).add("x", kind="mock", action="sdk.a")
    with pytest.raises(TypeError, match="depends_on takes the tasks themselves"):
        wf.add("second", kind="mock", action="sdk.a", depends_on=["first"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="of another workflow"):
        wf.add("third", kind="mock", action="sdk.a", depends_on=[other])
    wf.add("fourth", kind="mock", action="sdk.a", depends_on=[first])
    assert [t["depends_on"] for t in wf.to_dict()["tasks"][1:]] == [["first"]]


async def test_map_on_failure_and_always_declared_in_code_run(stack: Stack) -> None:
    numbers = [3, 1, 4, 1, 5, 9, 2, 6]
    async with stack.client() as client:
        await client.apply(sdk_flows.fanout)
        run = await client.start(sdk_flows.fanout, input={"numbers": numbers})
        with pytest.raises(RunFailed) as failed:
            await run.result(timeout=60)
        detail = await run.get()
    # The audit failed for good, and only it: its policy let the map and the sum go on.
    assert (failed.value.task_key, failed.value.error) == ("audit", "the audit log is read-only")
    tasks = detail.tasks
    assert tasks["square"].output == {
        "outputs": [{"index": i, "square": n * n} for i, n in enumerate(numbers)]
    }
    assert [tasks[f"square[{i}]"].state for i in range(len(numbers))] == ["succeeded"] * 8
    assert tasks["add_up"].output == {"sum": sum(n * n for n in numbers)}
    assert tasks["cleanup"].output == {"saw": {"add_up": "succeeded", "audit": "failed"}}


async def test_the_sync_client_does_the_same_from_plain_code(stack: Stack) -> None:
    def use() -> tuple[dict[str, dict[str, object]], list[str]]:
        with Client(stack.address, token=ADMIN_TOKEN) as client:
            client.apply(sdk_flows.numbers)
            run = client.start(sdk_flows.numbers, input={"values": [7]}, request_id="once")
            again = client.start(sdk_flows.numbers, input={"values": [7]}, request_id="once")
            assert (again.id, again.created) == (run.id, False)
            outputs = run.result(timeout=60)
            events = [event.type for event in run.watch()]
            listed = [r.id for r in client.list_runs(workflow="sdk-numbers", page_size=1)]
            assert listed == [run.id]
            return outputs, events

    outputs, events = await asyncio.to_thread(use)
    assert outputs["total"]["sum"] == 14
    assert events[0] == "run_created" and events[-1] == "run_state"


async def test_retry_reuses_what_succeeded_and_runs_the_rest(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.pipeline)
        first = await client.start(sdk_flows.pipeline, input={"item": 7})
        with pytest.raises(RunFailed) as failed:
            await first.result(timeout=60)
        assert failed.value.task_key == "publish"
        ran = sdk_flows.EXECUTIONS["prepare"]
        sdk_flows.BROKEN["publish"] = False
        try:
            second = await client.retry(first.id)
            outputs = await second.result(timeout=60)
        finally:
            sdk_flows.BROKEN["publish"] = True
        detail = await second.get()
    assert outputs == {"prepare": {"prepared": 7}, "publish": {"published": 7}}
    assert sdk_flows.EXECUTIONS["prepare"] == ran  # reused, not run again
    assert detail.run.retried_from_run_id == first.id
    assert detail.tasks["prepare"].reused_from_run_id == first.id
    assert detail.tasks["publish"].reused_from_run_id is None
