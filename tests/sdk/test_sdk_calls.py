"""Every ControlService call through the SDK against a real stack, answered in records:
workflows, runs, tasks, attempts, workers, stats, prune and who-am-i, sync and async."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
import sdk_flows
from sdk_stack import Stack

from awp.v1 import control_pb2_grpc
from awp_sdk import (
    AsyncClient,
    Client,
    FailurePolicy,
    PermissionDenied,
    RunFailed,
    RunState,
    StoredWorkflow,
    TaskState,
    WorkerState,
)
from awp_sdk.limits import RateLimits
from awp_sdk.schedules import Schedules
from kit import WORKER_TOKEN


async def test_each_call_answers_in_records(stack: Stack) -> None:
    async with stack.client() as client:
        applied = await client.apply(sdk_flows.broken)
        assert isinstance(applied.workflow, StoredWorkflow)
        stored = await client.get_workflow("sdk-broken")
        assert stored == applied.workflow
        lookup = stored.tasks[0]
        assert (lookup.key, lookup.on_failure, lookup.retry and lookup.retry.max_attempts) == (
            "lookup",
            FailurePolicy.FAIL_RUN,
            2,
        )
        assert stored.tasks[1].depends_on == ("lookup",)
        assert stored.definition["tasks"][0]["retry"]["max_attempts"] == 2
        assert [w.name async for w in client.list_workflows()] == ["sdk-broken"]

        run = await client.start(sdk_flows.broken, input={"key": "missing"})
        await client.run(run.id).get(outputs=False)
        with pytest.raises(RunFailed):
            await run.result(timeout=60)
        attempts = [a async for a in client.list_attempts(run.id, task_key="lookup")]
        assert [a.attempt for a in attempts] == [1, 2]
        assert attempts[-1].worker_name == "sdk-test-worker"
        assert attempts[-1].error is not None and attempts[-1].error.type == "KeyError"
        page = await client.list_tasks_page(run.id, page_size=1)
        assert [t.key for t in page.items] == ["lookup"] and page.next_page_token

        workers = await client.list_workers()
        assert [(w.name, w.state) for w in workers] == [("sdk-test-worker", WorkerState.ACTIVE)]
        stats = await client.get_stats()
        assert stats.runs_by_state == {RunState.FAILED: 1}
        assert stats.workers_by_state[WorkerState.ACTIVE] == 1
        assert all(count.state in TaskState for count in stats.tasks_by_state)

        pruned = await client.prune_runs(timedelta(days=1), dry_run=True)
        assert (pruned.runs, pruned.remaining) == (0, 0) and pruned.cutoff is not None
        me = await client.who_am_i()
        assert me.name and "admin" in me.roles and me.may("PruneRuns")


def test_the_sync_client_has_every_call_of_the_async_one() -> None:
    """The same names and parameters: a method added to one only is a test failure."""
    for name, method in inspect.getmembers(AsyncClient, inspect.isfunction):
        if name.startswith("_") or name in {"as_caller", "call", "stream", "close"}:
            continue
        assert hasattr(Client, name), f"Client lacks {name}"
        mine = list(inspect.signature(getattr(Client, name)).parameters)
        assert mine == list(inspect.signature(method).parameters), name


def test_every_control_rpc_has_a_client_method() -> None:
    rpcs = [
        name for name in dir(control_pb2_grpc.ControlServiceServicer) if not name.startswith("_")
    ]
    # The RPCs whose method is named for what it does, not the call.
    named = {
        "CreateWorkflow": "apply",
        "StartRun": "start",
        "StartRuns": "start_many",
        "RetryRun": "retry",
        "CancelRun": "cancel",
        "WatchRun": "watch",
        "WatchStream": "task_stream",
    }
    snake = {
        rpc: named.get(rpc) or "".join(f"_{c.lower()}" if c.isupper() else c for c in rpc)[1:]
        for rpc in rpcs
    }
    snake["WhoAmI"] = "who_am_i"
    # The schedule RPCs are awp_sdk.schedules.Schedules' (CreateSchedule: create), the
    # rate-limit RPCs awp_sdk.limits.RateLimits' (SetRateLimit: set).
    missing = [
        rpc
        for rpc, method in snake.items()
        if not hasattr(AsyncClient, method)
        and not (
            rpc.endswith(("Schedule", "Schedules")) and hasattr(Schedules, method.rsplit("_", 1)[0])
        )
        and not (
            rpc.endswith(("RateLimit", "RateLimits"))
            and hasattr(RateLimits, method.split("_", 1)[0])
        )
    ]
    assert missing == []


async def test_callers_share_one_channel_each_with_its_token(stack: Stack) -> None:
    async with stack.client() as admin:
        worker = admin.as_caller(WORKER_TOKEN)
        assert worker.channel._channel is admin.channel._channel
        assert (await worker.who_am_i()).roles == frozenset({"worker"})
        assert "admin" in (await admin.who_am_i()).roles
        with pytest.raises(PermissionDenied):
            await worker.get_stats()
        await worker.close()  # the channel stays open for its owner
        assert (await admin.get_stats()).active_leases == 0
