"""WorkerRuntime against a scriptable in-memory WorkerService (worker_fakes): the
protocol behaviour under faults that a real server cannot be made to produce on cue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from worker_fakes import (
    TOKEN,
    FakeServer,
    FakeWorkerService,
    Fault,
    start_fake,
)

from awp.v1 import types_pb2, worker_pb2
from awp_worker import ActionContext, RetryableError
from awp_worker._config import WorkerConfig
from awp_worker._executors import MockExecutor, PythonExecutor
from awp_worker._runtime import EXIT_FAILURE, EXIT_OK, EXIT_SESSION_LOST, WorkerRuntime
from awp_worker._sdk import ActionRegistry
from kit import poll_until as eventually
from kit.proto import output

UNAVAILABLE = Fault(grpc.StatusCode.UNAVAILABLE)


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = await start_fake(FakeWorkerService())
    try:
        yield server
    finally:
        await server.stop()


def make_config(fake: FakeServer, **overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "server": fake.address,
        "token": TOKEN,
        "name": "test-worker",
        "kinds": ("mock",),
        "concurrency": 4,
        "claim_wait": 0.3,
        "claim_backoff_initial": 0.01,
        "claim_backoff_max": 0.05,
        "shutdown_timeout": 5.0,
        "safety_margin": 0.1,
        "rpc_timeout": 2.0,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)


class Running:
    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.task = asyncio.create_task(runtime.run())

    async def registered(self) -> str:
        async with asyncio.timeout(10):
            return await self.runtime.wait_registered()

    async def exit_code(self) -> int:
        async with asyncio.timeout(20):
            return await self.task

    async def stop(self) -> int:
        self.runtime.request_shutdown()
        return await self.exit_code()


def start(fake: FakeServer, **overrides: Any) -> Running:
    return Running(WorkerRuntime(make_config(fake, **overrides)))


def succeeded(service: FakeWorkerService) -> int:
    return sum(
        1 for r in service.results().values() if r.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
    )


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
    worker = start(fake, concurrency=3, labels={"zone": "a"})
    await worker.registered()
    request = fake.service.last_register
    assert request is not None
    assert request.name == "test-worker" and request.protocol_version == 1
    assert list(request.executor_kinds) == ["mock"] and request.max_concurrency == 3
    assert dict(request.labels) == {"zone": "a"}
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

    service = fake.service
    ok = await service.add("math.add", {"a": 2, "b": 3}, kind="python")
    bad = await service.add("flaky", kind="python")
    missing = await service.add("nope", kind="python")
    worker = Running(
        WorkerRuntime(
            make_config(fake, kinds=("python",)),
            executors={"python": PythonExecutor(registry)},
        )
    )
    await eventually(lambda: len(service.results()) == 3)
    assert await worker.stop() == EXIT_OK
    results = service.results()
    assert output(results[ok.dispatch_id]) == {
        "sum": 5,
        "key": f"run-1/t{ok.dispatch_id}",
        "fence": 1000 + ok.dispatch_id,
    }
    assert results[bad.dispatch_id].error == types_pb2.TaskError(
        message="try again", retryable=True
    )
    assert "unknown action 'nope'" in results[missing.dispatch_id].error.message
    assert results[missing.dispatch_id].error.retryable is False


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
    worker = start(fake, token="wrong")
    assert await worker.exit_code() == EXIT_SESSION_LOST
    assert len(fake.service.register_metadata) == 1  # not retried


async def test_no_token_sends_no_authorization_header(fake: FakeServer) -> None:
    worker = start(fake, token="")
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


# --- Heartbeat ------------------------------------------------------------------------


async def test_idle_workers_heartbeat_every_interval(fake: FakeServer) -> None:
    worker = start(fake)
    await worker.registered()
    await eventually(lambda: len(fake.service.heartbeats) >= 3)
    assert all(not hb.leases for hb in fake.service.heartbeats)
    assert fake.service.streams_opened == 1  # one stream for the whole session
    assert await worker.stop() == EXIT_OK


async def test_heartbeats_list_held_leases_and_renewals_extend_the_deadline(
    fake: FakeServer,
) -> None:
    service = fake.service
    # The lease lasts 0.5 s unless renewed; the task takes 1.5 s.
    task = await service.add("slow", {"sleep_ms": 1500}, lease_s=0.5)
    worker = start(fake)
    await eventually(lambda: task.dispatch_id in service.results())
    assert await worker.stop() == EXIT_OK
    assert service.results()[task.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
    listed = [hb for hb in service.heartbeats if hb.leases]
    assert listed and all(
        [(r.dispatch_id, r.lease_token) for r in hb.leases] == [(task.dispatch_id, task.token)]
        for hb in listed
    )
    assert worker.runtime.metrics.safety_cancellations._value.get() == 0


async def test_a_broken_stream_is_reopened_at_once_and_leases_resent(fake: FakeServer) -> None:
    service = fake.service
    task = await service.add("slow", {"sleep_ms": 1500})
    # Long interval: only a reconnect (not the timer) can send the leases again soon.
    service.heartbeat_interval = 30.0
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    sent = len(service.heartbeats)
    service.break_streams()
    await eventually(lambda: service.streams_opened >= 2, within=1.0)
    await eventually(lambda: len(service.heartbeats) > sent, within=1.0)
    assert [r.dispatch_id for r in service.heartbeats[-1].leases] == [task.dispatch_id]
    assert worker.runtime.metrics.heartbeat_reconnects._value.get() >= 1
    assert await worker.stop() == EXIT_OK


async def test_revoked_leases_are_cancelled_and_not_reported(fake: FakeServer) -> None:
    service = fake.service
    task = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    service.revoke(task)
    await eventually(lambda: worker.runtime.held_leases == 0)
    assert worker.runtime.metrics.revocations.labels("revoked")._value.get() == 1
    # The lease is dropped first; the cancelled executor is counted once it has unwound.
    cancelled = worker.runtime.metrics.executions.labels("mock", "cancelled")
    await eventually(lambda: cancelled._value.get() == 1)
    assert not service.completes, "a revoked lease reported a result"
    assert await worker.stop() == EXIT_OK
    assert not service.completes  # nothing reported


async def test_the_safety_deadline_cancels_work_without_ownership(fake: FakeServer) -> None:
    service = fake.service
    # Heartbeats answer without extending the lease: it runs out after 0.6 s.
    task = await service.add("slow", {"sleep_ms": 30_000}, lease_s=0.6, renew="silent")
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    await eventually(lambda: worker.runtime.held_leases == 0, within=5.0)
    metrics = worker.runtime.metrics
    assert metrics.safety_cancellations._value.get() == 1
    assert metrics.executions.labels("mock", "safety_deadline")._value.get() == 1
    assert task.dispatch_id not in service.results()
    assert await worker.stop() == EXIT_OK
    # Given up locally, handed back in the final Drain so it is retried at once.
    assert [r.dispatch_id for r in service.drains[-1].hand_back] == [task.dispatch_id]


async def test_renewals_never_extend_past_the_attempt_deadline(fake: FakeServer) -> None:
    service = fake.service
    # Renewed generously, but the attempt itself ends after 0.8 s.
    task = await service.add("slow", {"sleep_ms": 30_000}, lease_s=10.0, attempt_s=0.8)
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    await eventually(lambda: worker.runtime.held_leases == 0, within=5.0)
    assert worker.runtime.metrics.safety_cancellations._value.get() == 1
    assert task.dispatch_id not in service.results()
    assert await worker.stop() == EXIT_OK


async def test_session_invalid_on_the_stream_is_permanent(fake: FakeServer) -> None:
    service = fake.service
    await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    service.fail("Heartbeat", Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    assert await worker.exit_code() == EXIT_SESSION_LOST
    assert worker.runtime.metrics.executions.labels("mock", "cancelled")._value.get() == 1
    assert not service.completes


async def test_an_offline_session_is_permanent(fake: FakeServer) -> None:
    worker = start(fake)
    await worker.registered()
    fake.service.forced_session_state = types_pb2.WORKER_STATE_OFFLINE
    assert await worker.exit_code() == EXIT_SESSION_LOST


# --- Claim ----------------------------------------------------------------------------


async def test_claims_never_exceed_free_slots(fake: FakeServer) -> None:
    service = fake.service
    for _ in range(7):
        await service.add("slow", {"sleep_ms": 100})
    worker = start(fake, concurrency=2)
    await eventually(lambda: len(service.results()) == 7)
    assert await worker.stop() == EXIT_OK
    assert all(c.max_leases <= 2 for c in service.claims)
    assert max(c.max_leases for c in service.claims) == 2


async def test_claim_errors_back_off_and_recover(fake: FakeServer) -> None:
    service = fake.service
    service.fail("Claim", UNAVAILABLE, UNAVAILABLE, Fault(grpc.StatusCode.INTERNAL))
    await service.add("x")
    worker = start(fake)
    await eventually(lambda: len(service.results()) == 1)
    assert worker.runtime.metrics.claims.labels("error")._value.get() == 3
    assert await worker.stop() == EXIT_OK


async def test_a_server_side_drain_stops_claiming_and_exits(fake: FakeServer) -> None:
    worker = start(fake)
    worker_id = await worker.registered()
    fake.service.sessions[worker_id] = "draining"
    assert await worker.exit_code() == EXIT_OK
    assert fake.service.sessions[worker_id] == "stopped"


async def test_session_invalid_on_claim_is_permanent(fake: FakeServer) -> None:
    fake.service.fail("Claim", Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    assert await start(fake).exit_code() == EXIT_SESSION_LOST


# --- Complete -------------------------------------------------------------------------


async def test_a_lost_complete_answer_is_retried_with_the_same_result(fake: FakeServer) -> None:
    service = fake.service
    service.fail("Complete", Fault(grpc.StatusCode.UNAVAILABLE, after=True))
    task = await service.add("x", {"v": 1})
    worker = start(fake)
    await eventually(lambda: len(service.completes) >= 2)
    await eventually(lambda: worker.runtime.held_leases == 0)
    first, second = service.completes[0], service.completes[1]
    assert list(first.results) == list(second.results)
    assert first.results[0].lease_token == task.token
    metrics = worker.runtime.metrics
    assert metrics.completes.labels("duplicate")._value.get() == 1
    assert await worker.stop() == EXIT_OK


async def test_lease_lost_answers_are_dropped(fake: FakeServer) -> None:
    service = fake.service
    task = await service.add("x", {"sleep_ms": 200})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    task.token = "rotated"  # the server no longer recognises the worker's lease
    await eventually(lambda: worker.runtime.held_leases == 0)
    metrics = worker.runtime.metrics
    # The heartbeat (UNKNOWN) or the Complete (LEASE_LOST) notices, or both when the
    # result was already on its way as the heartbeat answered; never is it accepted.
    assert (
        metrics.completes.labels("lease_lost")._value.get()
        + metrics.revocations.labels("unknown")._value.get()
        >= 1
    )
    assert metrics.completes.labels("accepted")._value.get() == 0
    assert await worker.stop() == EXIT_OK


async def test_session_invalid_on_complete_is_permanent(fake: FakeServer) -> None:
    fake.service.fail("Complete", Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    await fake.service.add("x")
    assert await start(fake).exit_code() == EXIT_SESSION_LOST


# --- Drain ----------------------------------------------------------------------------


async def test_shutdown_drains_finishes_running_leases_and_stops(fake: FakeServer) -> None:
    service = fake.service
    task = await service.add("slow", {"sleep_ms": 500})
    worker = start(fake)
    worker_id = await worker.registered()
    await eventually(lambda: worker.runtime.held_leases == 1)
    worker.runtime.request_shutdown()
    await eventually(lambda: service.drains)
    later = await service.add("later")  # not claimed once draining
    assert await worker.exit_code() == EXIT_OK
    assert service.results()[task.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
    assert later.state == "pending"
    assert service.sessions[worker_id] == "stopped"
    assert len(service.drains) == 2 and not service.drains[-1].hand_back


async def test_the_shutdown_timeout_hands_unfinished_leases_back(fake: FakeServer) -> None:
    service = fake.service
    slow = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake, shutdown_timeout=0.3)
    worker_id = await worker.registered()
    await eventually(lambda: worker.runtime.held_leases == 1)
    assert await worker.stop() == EXIT_OK
    assert [r.dispatch_id for r in service.drains[-1].hand_back] == [slow.dispatch_id]
    assert slow.state == "handed_back"
    assert service.sessions[worker_id] == "stopped"
    assert worker.runtime.metrics.executions.labels("mock", "cancelled")._value.get() == 1


async def test_a_second_shutdown_request_hands_back_at_once(fake: FakeServer) -> None:
    service = fake.service
    slow = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake, shutdown_timeout=60.0)
    await eventually(lambda: worker.runtime.held_leases == 1)
    worker.runtime.request_shutdown()
    await eventually(lambda: service.drains)
    worker.runtime.request_shutdown()
    assert await worker.exit_code() == EXIT_OK
    assert slow.state == "handed_back"


async def test_a_failed_final_drain_exits_1(fake: FakeServer) -> None:
    worker = start(fake, rpc_timeout=0.5)
    await worker.registered()
    fake.service.fail("Drain", *[Fault(grpc.StatusCode.PERMISSION_DENIED)] * 2)
    assert await worker.stop() == EXIT_FAILURE


# --- supervision ----------------------------------------------------------------------


class Crash(BaseException):
    """Not an Exception: escapes the executor's error handling, like a bug would."""


class CrashingExecutor:
    async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
        if input.get("crash"):
            raise Crash("bug")
        await asyncio.sleep(30)
        return {}


async def test_an_unexpected_failure_stops_everything_and_hands_back(fake: FakeServer) -> None:
    service = fake.service
    sleeper = await service.add("sleep")
    worker = Running(
        WorkerRuntime(make_config(fake, concurrency=1), executors={"mock": CrashingExecutor()})
    )
    await eventually(lambda: worker.runtime.held_leases == 1)
    await service.add("crash", {"crash": True})
    # Concurrency 1: the crash task is claimed only after the sleeper is gone, so
    # revoke the sleeper to make room.
    service.revoke(sleeper)
    assert await worker.exit_code() == EXIT_FAILURE
    crashed = next(t for t in service.tasks.values() if t.input.get("crash"))
    assert crashed.state == "handed_back"


async def test_executors_can_be_injected(fake: FakeServer) -> None:
    class Constant(MockExecutor):
        async def execute(self, ctx: ActionContext, input: dict[str, Any]) -> object:
            return {"constant": True}

    task = await fake.service.add("x")
    worker = Running(WorkerRuntime(make_config(fake), executors={"mock": Constant()}))
    await eventually(fake.service.results)
    assert output(fake.service.results()[task.dispatch_id]) == {"constant": True}
    assert await worker.stop() == EXIT_OK


def test_every_kind_needs_an_executor() -> None:
    with pytest.raises(ValueError, match="no executor for kind"):
        WorkerRuntime(WorkerConfig(kinds=("mock", "shell")))
