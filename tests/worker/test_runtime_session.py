"""WorkerRuntime against a scriptable in-memory WorkerService (worker_fakes): work runs
and is reported, and Register retries what is transient and exits on what is not."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import grpc
from runtime_harness import UNAVAILABLE, Running, make_config, start
from worker_fakes import TOKEN, FakeServer, FakeWorkerService, Fault, start_fake

from awp.v1 import types_pb2, worker_pb2
from awp_sdk.actions import ActionRegistry
from awp_worker import ActionContext, RetryableError
from awp_worker._executors import PythonExecutor
from awp_worker._lifecycle import EXIT_OK, EXIT_SESSION_LOST
from awp_worker._runtime import WorkerRuntime
from kit import poll_until as eventually
from kit.proto import output

# --- the happy path -------------------------------------------------------------------


async def test_runs_mock_tasks_and_reports_coalesced_results(fake: FakeServer) -> None:
    service = fake.service
    tasks = [await service.add("echo", {"n": i, "sleep_ms": 20}) for i in range(12)]
    worker = start(fake, concurrency=8)
    await eventually(lambda: len(service.results()) == 12)
    assert await worker.stop() == EXIT_OK
    for task in tasks:
        result = service.results()[task.dispatch_id]
        assert result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
        assert result.lease_token == task.token
        # Whole numbers come back as ints, and the output echoes the input.
        assert output(result) == {"action": "echo", "echo": task.input, "attempt": 1}
    # Coalesced: 12 results in fewer Complete calls than results.
    assert len(service.completes) < 12
    assert sum(len(c.results) for c in service.completes) == 12
    # Never asked for more than its free slots.
    assert all(1 <= c.max_leases <= 8 for c in service.claims)
    metrics = worker.runtime.metrics
    assert metrics.completes.labels("accepted")._value.get() == 12
    assert metrics.executions.labels("mock", "succeeded")._value.get() == 12


async def test_register_sends_token_kinds_concurrency_and_labels(fake: FakeServer) -> None:
    worker = start(
        fake, concurrency=3, labels={"zone": "a"}, models=("llama3-8b",), resources={"gpu": 2}
    )
    await worker.registered()
    request = fake.service.last_register
    assert request is not None
    assert request.name == "test-worker" and request.protocol_version == 1
    assert list(request.executor_kinds) == ["mock"] and request.max_concurrency == 3
    assert dict(request.labels) == {"zone": "a"}
    assert list(request.models) == ["llama3-8b"] and dict(request.resources) == {"gpu": 2}
    assert fake.service.register_metadata[-1]["authorization"] == f"Bearer {TOKEN}"
    assert await worker.stop() == EXIT_OK


async def test_failures_are_reported_with_retryable_flag(fake: FakeServer) -> None:
    service = fake.service
    permanent = await service.add("x", {"fail": "boom"})
    retryable = await service.add("x", {"fail_attempts": 2}, attempt=2)
    passes = await service.add("x", {"fail_attempts": 2}, attempt=3)
    worker = start(fake)
    await eventually(lambda: len(service.results()) == 3)
    assert await worker.stop() == EXIT_OK
    results = service.results()
    assert results[permanent.dispatch_id].error == types_pb2.TaskError(
        message="boom", retryable=False
    )
    assert results[retryable.dispatch_id].error.retryable is True
    assert results[passes.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED


async def test_python_actions_run_through_the_runtime(fake: FakeServer) -> None:
    registry = ActionRegistry()

    @registry.action("math.add")
    def add(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {
            "sum": input["a"] + input["b"],
            "key": ctx.idempotency_key,
            "fence": ctx.fencing_token,
        }

    @registry.action("flaky")
    async def flaky(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        raise RetryableError("try again")

    def lookup(data: dict[str, Any]) -> Any:
        return data["missing"]

    @registry.action("broken")
    def broken(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        ctx.logger.warning("about to look it up")
        return lookup({})

    service = fake.service
    ok = await service.add("math.add", {"a": 2, "b": 3}, kind="python")
    bad = await service.add("flaky", kind="python")
    missing = await service.add("nope", kind="python")
    sync = await service.add("broken", kind="python")
    worker = Running(
        WorkerRuntime(
            make_config(fake, kinds=("python",)),
            executors={"python": PythonExecutor(registry)},
        )
    )
    await eventually(lambda: len(service.results()) == 4)
    assert await worker.stop() == EXIT_OK
    results = service.results()
    assert output(results[ok.dispatch_id]) == {
        "sum": 5,
        "key": f"run-1/t{ok.dispatch_id}",
        "fence": 1000 + ok.dispatch_id,
    }
    error = results[bad.dispatch_id].error
    assert (error.message, error.retryable, error.type) == ("try again", True, "")
    # The traceback starts at the action's frame, async or in a thread: none of the
    # worker's own, nor asyncio's or the thread pool's.
    assert _frames(error.traceback) == ["flaky"]
    error = results[sync.dispatch_id].error
    assert (error.message, error.type) == ("KeyError: 'missing'", "KeyError")
    assert _frames(error.traceback) == ["broken", "lookup"]
    assert error.traceback.endswith("KeyError: 'missing'\n")
    assert error.log_tail.endswith("WARNING awp_worker.action: about to look it up")
    assert "unknown action 'nope'" in results[missing.dispatch_id].error.message
    assert results[missing.dispatch_id].error.retryable is False
    assert results[missing.dispatch_id].error.traceback == ""  # the worker's own refusal


def _frames(traceback: str) -> list[str]:
    """The function of each frame of a traceback, outermost first."""
    return [
        line.rsplit(" ", 1)[-1] for line in traceback.splitlines() if line.startswith('  File "')
    ]


# --- Register -------------------------------------------------------------------------


async def test_register_retries_transient_errors(fake: FakeServer) -> None:
    fake.service.fail("Register", UNAVAILABLE, Fault(grpc.StatusCode.DEADLINE_EXCEEDED))
    worker = start(fake)
    await worker.registered()
    assert len(fake.service.register_metadata) == 3
    assert await worker.stop() == EXIT_OK


async def test_register_retries_until_the_server_comes_up() -> None:
    service = FakeWorkerService()
    probe = await start_fake(service)
    address, port = probe.address, int(probe.address.rsplit(":", 1)[1])
    await probe.stop()  # nothing listens on the port now
    worker = Running(WorkerRuntime(replace(make_config(probe), server=address)))
    await asyncio.sleep(0.5)
    assert not worker.task.done()
    late = await start_fake(service, port=port)
    try:
        await worker.registered()
        assert await worker.stop() == EXIT_OK
    finally:
        await late.stop()


async def test_a_bad_worker_token_exits_with_code_3(fake: FakeServer) -> None:
    worker = start(fake, worker_token="wrong")
    assert await worker.exit_code() == EXIT_SESSION_LOST
    assert len(fake.service.register_metadata) == 1  # not retried


async def test_no_token_sends_no_authorization_header(fake: FakeServer) -> None:
    worker = start(fake, worker_token="")
    assert await worker.exit_code() == EXIT_SESSION_LOST
    assert "authorization" not in fake.service.register_metadata[0]


async def test_an_unsupported_protocol_exits_with_code_3(fake: FakeServer) -> None:
    fake.service.fail(
        "Register", Fault(grpc.StatusCode.FAILED_PRECONDITION, "PROTOCOL_UNSUPPORTED")
    )
    assert await start(fake).exit_code() == EXIT_SESSION_LOST


async def test_shutdown_during_a_register_call_exits_promptly(fake: FakeServer) -> None:
    # The retry loop must not take the cancellation for a transient error.
    fake.service.fail("Register", Fault(grpc.StatusCode.OK, hang=True))
    worker = start(fake)
    await eventually(lambda: fake.service.register_metadata)
    assert await worker.stop() == EXIT_OK
    assert len(fake.service.register_metadata) == 1


async def test_shutdown_while_registering_exits_cleanly() -> None:
    service = FakeWorkerService()
    probe = await start_fake(service)
    await probe.stop()
    worker = Running(WorkerRuntime(make_config(probe)))
    await asyncio.sleep(0.3)
    assert await worker.stop() == EXIT_OK


async def test_a_result_the_server_refuses_does_not_wedge_its_batch(fake: FakeServer) -> None:
    """Issue 13: an action's error holds a NUL, which the server refuses, among 8
    coalesced results. The worker isolates it by bisection and reports it as failed
    with the server's reason; the 7 others are recorded; nothing is resent forever."""
    registry = ActionRegistry()

    @registry.action("poison.maybe")
    async def maybe(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        if input["poison"]:
            raise RetryableError("bad\x00byte")
        return {"ok": True}

    service = fake.service
    tasks = [await service.add("poison.maybe", {"poison": i == 3}, kind="python") for i in range(8)]
    worker = Running(
        WorkerRuntime(
            make_config(fake, kinds=("python",), concurrency=8, flush_size=8, flush_interval=5.0),
            executors={"python": PythonExecutor(registry)},
        )
    )
    await eventually(lambda: len(service.results()) == 8)
    assert await worker.stop() == EXIT_OK
    results = service.results()
    assert service.completes[0].results[3].error.message == "bad\x00byte"
    assert len(service.completes[0].results) == 8
    for i, task in enumerate(tasks):
        result = results[task.dispatch_id]
        if i != 3:
            assert output(result) == {"ok": True}
            continue
        assert result.outcome == worker_pb2.RESULT_OUTCOME_FAILED
        assert "must not contain NUL characters" in result.error.message
        assert result.error.message.endswith("began: bad\\x00byte")
        assert result.error.retryable is True
