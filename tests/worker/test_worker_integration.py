"""WorkerRuntime against the real awp-server and coordinator (in-process) over real
PostgreSQL: runs go to completion, failures follow the retry rule, cancellation revokes
running leases, a drain stops the session and a shutdown grace hands leases back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
from runtime_harness import Running

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator
from awp_db import runs
from awp_db.connect import Pool
from awp_protocol.limits import MAX_OUTPUT_BYTES
from awp_sdk.actions import ActionRegistry
from awp_worker import ActionContext
from awp_worker._config import WorkerConfig
from awp_worker._executors import PythonExecutor
from awp_worker._lifecycle import EXIT_OK, EXIT_SESSION_LOST
from awp_worker._runtime import WorkerRuntime
from kit import WORKER_TOKEN, ServerHandle, poll_until, spec, start_run
from kit.db import revocation_notices_off

ServerFactory = Callable[..., Awaitable[ServerHandle]]


@pytest.fixture
async def server(start_server: ServerFactory) -> ServerHandle:
    # Short intervals so that renewals happen within a test's lifetime.
    return await start_server(heartbeat_interval_s=0.5, lease_ttl_s=3.0)


def worker_config(server: ServerHandle, **overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "server": server.address,
        "worker_token": WORKER_TOKEN,
        "name": "it-worker",
        "kinds": ("mock",),
        "concurrency": 4,
        "claim_wait": 0.5,
        "shutdown_grace": 10.0,
        "safety_margin": 0.5,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)


def start_worker(config: WorkerConfig, **kwargs: Any) -> Running:
    # The real server's sessions take longer to end than the fake's.
    return Running(WorkerRuntime(config, **kwargs), within=30.0)


async def run_state(pool: Pool, run_id: UUID, *states: str, within: float = 30.0) -> str:
    async def probe() -> str | None:
        state = (await runs.get(pool, run_id)).state
        return state if state in states else None

    return await poll_until(probe, within=within)


async def cancel_once_held(worker: Running, pool: Pool, run_id: UUID) -> None:
    """Cancels the run once the worker holds its one lease; returns once it is canceled."""

    async def running() -> bool:
        return worker.runtime.held_leases == 1

    await poll_until(running, within=20)
    async with pool.acquire() as conn:
        await runs.request_cancel(conn, run_id, "test", "test")
    assert await run_state(pool, run_id, "canceled") == "canceled"


async def test_a_workflow_runs_to_completion_and_the_worker_stops(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    run_id = await start_run(pool, spec("chain", tasks=6, chain=True, task_input={"n": 1}))
    other = await start_run(pool, spec("fan", tasks=12, task_input={"sleep_ms": 20}))
    worker = start_worker(worker_config(server))
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await run_state(pool, other, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    attempts = await pool.fetch(
        "SELECT t.key, a.attempt, a.state FROM attempts a"
        " JOIN tasks t ON t.id = a.task_id WHERE a.run_id = $1",
        run_id,
    )
    assert sorted(a["key"] for a in attempts) == [f"t{i}" for i in range(6)]
    assert {(a["attempt"], a["state"]) for a in attempts} == {(1, "succeeded")}
    worker_state = await pool.fetchval(
        "SELECT state FROM workers WHERE id = $1::uuid", worker.runtime.worker_id
    )
    assert worker_state == "stopped"
    metrics = worker.runtime.metrics
    assert metrics.completes.labels("accepted")._value.get() == 18


async def test_retryable_failures_retry_and_permanent_ones_fail_the_run(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    flaky = await start_run(pool, spec("flaky", tasks=2, task_input={"fail_attempts": 1}))
    broken = await start_run(pool, spec("broken", tasks=1, task_input={"fail": "nope"}))
    worker = start_worker(worker_config(server))
    assert await run_state(pool, flaky, "succeeded", "failed") == "succeeded"
    assert await run_state(pool, broken, "succeeded", "failed") == "failed"
    assert await worker.stop() == EXIT_OK
    states = await pool.fetch(
        "SELECT attempt, state FROM attempts WHERE run_id = $1 ORDER BY attempt", flaky
    )
    assert [(r["attempt"], r["state"]) for r in states] == [
        (1, "failed"),
        (1, "failed"),
        (2, "succeeded"),
        (2, "succeeded"),
    ]
    error = await pool.fetchval("SELECT error FROM attempts WHERE run_id = $1", broken)
    assert "nope" in str(error)


async def test_python_actions_with_the_sdk(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    registry = ActionRegistry()
    seen: list[tuple[str, int, int]] = []
    contexts: dict[str, ActionContext] = {}

    @registry.action("noop")
    def noop(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        seen.append((ctx.idempotency_key, ctx.attempt, ctx.fencing_token))
        contexts[ctx.task_key] = ctx
        return {"key": ctx.task_key}

    run_id = await start_run(
        pool, spec("py", tasks=3, kind="python", chain=True), run_input={"topic": "x"}
    )
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    assert sorted(key for key, _, _ in seen) == [f"{run_id}/t{i}" for i in range(3)]
    assert len({fence for _, _, fence in seen}) == 3
    # Each action sees the run input and its dependency's output.
    assert all(ctx.run_input == {"topic": "x"} for ctx in contexts.values())
    assert contexts["t0"].upstream == {}
    assert contexts["t2"].upstream == {"t1": {"key": "t1"}}


async def test_an_action_sees_upstream_outputs_too_large_for_its_lease(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    """Six outputs of ~1 MiB cannot travel in one Claim answer (the worker's channel
    takes gRPC's default 4 MiB): the worker fetches them before the action runs."""
    registry = ActionRegistry()
    upstream: dict[str, dict[str, Any]] = {}

    @registry.action("big")
    def big(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"key": ctx.task_key, "text": ctx.task_key[-1] * (MAX_OUTPUT_BYTES - 100)}

    @registry.action("gather")
    def gather(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        upstream.update(ctx.upstream)
        return {"seen": sorted(ctx.upstream)}

    workflow = spec("gather", tasks=7, kind="python", depends={6: list(range(6))})
    workflow = replace(
        workflow,
        tasks=tuple(
            replace(task, action="gather" if task.key == "t6" else "big") for task in workflow.tasks
        ),
    )
    run_id = await start_run(pool, workflow)
    worker = start_worker(
        worker_config(server, kinds=("python",)), executors={"python": PythonExecutor(registry)}
    )
    assert await run_state(pool, run_id, "succeeded", "failed", within=60) == "succeeded"
    assert await worker.stop() == EXIT_OK
    assert sorted(upstream) == [f"t{i}" for i in range(6)]
    assert all(
        out == {"key": k, "text": k[-1] * (MAX_OUTPUT_BYTES - 100)} for k, out in upstream.items()
    )


async def test_cancelling_a_run_revokes_its_running_lease(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    run_id = await start_run(pool, spec("long", tasks=1, task_input={"sleep_ms": 60_000}))
    worker = start_worker(worker_config(server))
    await cancel_once_held(worker, pool, run_id)

    metrics = worker.runtime.metrics

    async def released() -> bool:
        # The lease is released at the revocation; the executor's cancellation is
        # counted when its task has ended, a moment later: wait for both.
        cancelled = metrics.executions.labels("mock", "cancelled")._value.get()
        return worker.runtime.held_leases == 0 and cancelled > 0

    await poll_until(released, within=20)
    assert metrics.revocations.labels("revoked")._value.get() == 1
    assert metrics.executions.labels("mock", "cancelled")._value.get() == 1
    assert metrics.complete_calls.labels("ok")._value.get() == 0  # nothing reported
    assert await worker.stop() == EXIT_OK


async def test_a_drain_right_after_a_cancel_stops_cleanly(
    start_server: ServerFactory, coordinator: Coordinator, pool: Pool
) -> None:
    """The run is canceled, and the worker drains before anything tells it (its next
    heartbeat is 30 s away, and the revocation's push is lost: the trigger that sends
    its notice is off meanwhile): the Drain stops the session at once (the server holds
    no lease of it any more), so the lease the worker still runs is no longer its own.
    It is cancelled, not waited for, and the session's end is not mistaken for a lost
    one (exit 0, not 3)."""
    server = await start_server(heartbeat_interval_s=30.0, lease_ttl_s=60.0)
    run_id = await start_run(pool, spec("raced", tasks=1, task_input={"sleep_ms": 60_000}))
    worker = start_worker(worker_config(server, shutdown_grace=60.0))
    async with revocation_notices_off(pool):
        await cancel_once_held(worker, pool, run_id)
    assert worker.runtime.held_leases == 1  # nothing has told it yet

    assert await worker.stop() == EXIT_OK
    metrics = worker.runtime.metrics
    assert metrics.executions.labels("mock", "cancelled")._value.get() == 1
    assert metrics.complete_calls.labels("ok")._value.get() == 0  # nothing reported
    assert (
        await pool.fetchval(
            "SELECT state FROM workers WHERE id = $1::uuid", worker.runtime.worker_id
        )
        == "stopped"
    )


async def test_renewals_keep_a_task_longer_than_the_lease_ttl(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    # Lease TTL 3 s, heartbeat 0.5 s: a 4 s task lives on renewals alone.
    run_id = await start_run(pool, spec("renew", tasks=1, task_input={"sleep_ms": 4_000}))
    worker = start_worker(worker_config(server))
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    assert await worker.stop() == EXIT_OK
    assert worker.runtime.metrics.safety_cancellations._value.get() == 0


async def test_a_shutdown_grace_hands_the_lease_back_for_an_immediate_retry(
    server: ServerHandle, coordinator: Coordinator, pool: Pool
) -> None:
    run_id = await start_run(pool, spec("handback", tasks=1, task_input={"sleep_ms": 60_000}))
    first = start_worker(worker_config(server, name="first", shutdown_grace=0.5))

    async def held() -> bool:
        return first.runtime.held_leases == 1

    await poll_until(held, within=20)
    assert await first.stop() == EXIT_OK
    attempt = await pool.fetchrow("SELECT state, error FROM attempts WHERE run_id = $1", run_id)
    assert attempt["state"] == "interrupted"
    assert await pool.fetchval(
        "SELECT state FROM workers WHERE id = $1::uuid", first.runtime.worker_id
    ) in ("stopped",)
    # Retried at once by another worker, not after a lease TTL.
    second = start_worker(worker_config(server, name="second"))

    async def retried() -> bool:
        count: int = await pool.fetchval(
            "SELECT count(*) FROM attempts WHERE run_id = $1 AND attempt = 2", run_id
        )
        return count == 1

    await poll_until(retried, within=20)
    second.runtime.request_shutdown()
    second.runtime.request_shutdown()  # do not wait for the 60 s task
    assert await second.exit_code() == EXIT_OK


async def test_a_wrong_worker_token_exits_with_code_3(server: ServerHandle) -> None:
    worker = start_worker(worker_config(server, worker_token="wrong"))
    assert await worker.exit_code() == EXIT_SESSION_LOST


async def test_an_idle_worker_stays_active_across_ten_lease_ttls(
    start_server: ServerFactory, pool: Pool, database_dsn: str
) -> None:
    # Offline after 3 silent heartbeats (0.45 s, the server's interval, which the coordinator
    # reads from the session): only steady idle heartbeats keep it active.
    server = await start_server(heartbeat_interval_s=0.15, lease_ttl_s=0.6)
    coordinator = Coordinator(
        pool,
        CoordinatorConfig(
            database_url=database_dsn,
            scan_interval_s=0.05,
            metrics_listen=None,
        ),
    )
    stop = asyncio.Event()
    coordinating = asyncio.create_task(coordinator.run(stop))
    worker = start_worker(worker_config(server))
    try:
        worker_id = await worker.runtime.wait_registered()
        loop = asyncio.get_running_loop()
        watch_until = loop.time() + 10 * server.config.lease_ttl_s
        states = []
        # A hold for a duration, not a synchronisation: sample the state throughout.
        while loop.time() < watch_until:
            states.append(
                await pool.fetchval("SELECT state FROM workers WHERE id = $1", UUID(worker_id))
            )
            await asyncio.sleep(0.05)
        assert set(states) == {"active"}, states
        assert worker.runtime.metrics.heartbeat_reconnects._value.get() == 0
    finally:
        assert await worker.stop() == EXIT_OK
        stop.set()
        async with asyncio.timeout(10):
            await coordinating
