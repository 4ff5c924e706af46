"""The queue, fleet and run-outcome gauges the leader exports: what the database holds,
read on partial indexes (awp_db.stats.gauges), and only while leading."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from awp_coordinator import queue_gauges
from awp_coordinator.queue_gauges import QueueGauges
from awp_db import ratelimits, stats
from awp_db.connect import Pool
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.ratelimits import RateUse
from kit import flows, poll_until, spec, start_run
from kit.db import dispatch_all, drive_to_end, register


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def _read(pool: Pool, gauges: QueueGauges) -> None:
    gauges.latest = await stats.gauges(pool, queue_gauges.RUN_OUTCOME_WINDOW_S)


async def test_the_gauges_follow_the_queue_and_the_outcomes(pool: Pool) -> None:
    registry = CollectorRegistry()
    gauges = QueueGauges(registry)
    assert "awp_dispatches" not in {m.name for m in registry.collect()}, "none before a read"

    worker = await register(pool, ["mock"], max_concurrency=10)
    await register(pool, ["python"], name="idle")
    first = await start_run(pool, spec("gauged", 3))
    await _read(pool, gauges)
    assert _value(registry, "awp_ready_tasks", executor_kind="mock") == 3
    assert _value(registry, "awp_dispatches", state="pending", executor_kind="mock") == 0
    assert _value(registry, "awp_oldest_pending_dispatch_seconds") == 0
    assert _value(registry, "awp_workers", state="active") == 2
    assert _value(registry, "awp_workers", state="draining") == 0
    assert _value(registry, "awp_running_runs") == 1

    await dispatch_all(pool)
    (leased, *_) = await worker.claim(1)
    await _read(pool, gauges)
    assert _value(registry, "awp_ready_tasks", executor_kind="mock") == 0
    assert _value(registry, "awp_dispatches", state="pending", executor_kind="mock") == 2
    assert _value(registry, "awp_dispatches", state="leased", executor_kind="mock") == 1
    oldest = _value(registry, "awp_oldest_pending_dispatch_seconds")
    assert oldest is not None and oldest > 0

    await worker.complete(leased)
    assert await drive_to_end(pool, first, worker) == "succeeded"
    failing = await start_run(pool, spec("gauged-failing", 1, max_attempts=1))
    (doomed,) = await worker.dispatch_and_claim()
    await worker.complete(doomed, "failed", retryable=False)
    await worker.drain()
    await _read(pool, gauges)
    outcomes = {
        (s.labels["workflow"], s.labels["outcome"]): s.value
        for m in registry.collect()
        if m.name == "awp_recent_run_outcomes"
        for s in m.samples
    }
    assert outcomes == {("gauged", "succeeded"): 1, ("gauged-failing", "failed"): 1}, failing
    assert _value(registry, "awp_running_runs") == 0
    assert _value(registry, "awp_workers", state="active") == 1
    # A kind without work reads 0 while a live worker serves it, and is gone after.
    assert _value(registry, "awp_dispatches", state="pending", executor_kind="python") == 0
    assert _value(registry, "awp_ready_tasks", executor_kind="python") == 0
    assert _value(registry, "awp_dispatches", state="pending", executor_kind="mock") is None


async def test_only_the_leader_exports_them(pool: Pool) -> None:
    registry = CollectorRegistry()
    gauges = QueueGauges(registry)
    leading = asyncio.Event()
    stop = asyncio.Event()
    refreshing = asyncio.create_task(queue_gauges.refresh(gauges, pool, leading.is_set, 0.05, stop))
    try:
        await start_run(pool, spec("lead", 2))
        leading.set()
        await poll_until(
            lambda: _value(registry, "awp_ready_tasks", executor_kind="mock") == 2,
            "the leader's gauges",
        )
        leading.clear()
        await poll_until(
            lambda: _value(registry, "awp_running_runs") is None, "a standby exports none"
        )
    finally:
        stop.set()
        await refreshing


async def test_the_flow_gauges_follow_units_and_rate_limits(pool: Pool) -> None:
    """Concurrency units held and each rate limit's budget, use and pause."""
    registry = CollectorRegistry()
    gauges = QueueGauges(registry)
    async with pool.acquire() as conn:
        await ratelimits.set_limit(conn, "api", 5, 60_000, "test")
    workflow = validate(
        WorkflowSpec(
            name="flowing",
            version=1,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind="mock",
                    action="noop",
                    concurrency_limits=(ConcurrencyLimit("user:{input.user}", 2),),
                    rate_limits=(RateUse("api", "1"),),
                )
                for i in range(3)
            ),
        )
    )
    await start_run(pool, workflow, run_input={"user": "ann"})
    await register(pool, ["mock"], max_concurrency=10)
    assert await dispatch_all(pool) == 2
    await _read(pool, gauges)
    assert _value(registry, "awp_concurrency_units_held") == 2
    assert _value(registry, "awp_concurrency_keys_held") == 1
    assert _value(registry, "awp_rate_limit_units", limit="api") == 5
    assert _value(registry, "awp_rate_limit_used_units", limit="api") == 2
    assert _value(registry, "awp_rate_limit_paused", limit="api") == 0


async def test_ready_tasks_are_counted_by_base_priority(pool: Pool) -> None:
    registry = CollectorRegistry()
    gauges = QueueGauges(registry)
    await start_run(pool, spec("plain", 2))
    urgent = await start_run(pool, spec("urgent", 3))
    await pool.execute("UPDATE runs SET priority = 4 WHERE id = $1", urgent)
    await pool.execute("UPDATE tasks SET priority = 1 WHERE run_id = $1 AND key = 't0'", urgent)
    await _read(pool, gauges)
    assert _value(registry, "awp_ready_tasks_by_priority", priority="0") == 2
    assert _value(registry, "awp_ready_tasks_by_priority", priority="4") == 2
    assert _value(registry, "awp_ready_tasks_by_priority", priority="5") == 1


async def test_a_limit_holding_tasks_back_is_counted_and_its_throttled_time_accrues(
    pool: Pool,
) -> None:
    """Ready tasks held back by a full concurrency key and by a rate limit without units
    free, and the time each held them back across the leader's readings."""
    registry = CollectorRegistry()
    gauges = QueueGauges(registry)
    async with pool.acquire() as conn:
        await ratelimits.set_limit(conn, "tokens", 3, 60_000, "test")
    keyed = flows.keyed("keyed", "llm", 3)
    rated = flows.rated("rated", "tokens", "2", 2)
    await start_run(pool, keyed)
    await start_run(pool, rated)
    await register(pool, ["mock"], max_concurrency=10, grants=False)
    assert await dispatch_all(pool) == 2  # one unit of llm; 2 of the 3 tokens
    gauges.observe(await stats.gauges(pool, queue_gauges.RUN_OUTCOME_WINDOW_S), 100.0)
    assert _value(registry, "awp_limit_waiting_tasks", kind="key", limit="llm") == 2
    assert _value(registry, "awp_limit_waiting_tasks", kind="rate", limit="tokens") == 1
    assert _value(registry, "awp_limit_throttled_seconds_total", kind="key", limit="llm") is None
    # Held back at the next reading too: the time between them counts; a gap with no
    # reading (a failed read, a standby) counts nothing.
    gauges.observe(await stats.gauges(pool, queue_gauges.RUN_OUTCOME_WINDOW_S), 102.5)
    assert _value(registry, "awp_limit_throttled_seconds_total", kind="key", limit="llm") == 2.5
    assert _value(registry, "awp_limit_throttled_seconds_total", kind="rate", limit="tokens") == 2.5
    gauges.observe(None, 103.0)
    gauges.observe(await stats.gauges(pool, queue_gauges.RUN_OUTCOME_WINDOW_S), 110.0)
    assert _value(registry, "awp_limit_throttled_seconds_total", kind="key", limit="llm") == 2.5
