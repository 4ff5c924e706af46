"""Retention under live load, with real processes (DESIGN.md §7, docs/retention.md): the
leader prunes a large backlog of old finished runs while workflows keep running, and the
live work does not notice beyond a share of the machine.

The backlog (kit.backlog: tens of thousands of runs with their tasks, attempts,
dispatches and events) is in the database before the processes start. A coordinator
with --retention 0 leads first, so the live throughput is measured over the same tables
without pruning; then it hands over (SIGTERM: it resigns the lease) to a standby with
--retention 30d, which prunes while the same workload goes on. Shown: every live run
succeeds with all its tasks and events, the backlog reaches 0, nothing waited on a lock
for long (no lock-timeout error in any log, and the longest lock wait sampled), and the
figures: the prune rate and the live throughput with and without pruning.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

import pytest
import workload
from cluster import ADMIN_AUTH, Cluster
from figures import report_figure
from probes import seconds_between

from awp.v1 import control_pb2, runs_pb2
from kit import backlog, poll_until
from kit.invariants import Expect

pytestmark = pytest.mark.fault

BACKLOG_RUNS = 20_000
BACKLOG_TASKS = 3
BATCH = 200
IN_FLIGHT = 8  # live runs kept going at once
BASELINE_RUNS = 48
LIVE = workload.definition("live", workload.fan_out_in(3))
# What a lock wait ending in an error looks like in any process's log.
LOCK_ERRORS = ("lock timeout", "LockNotAvailable", "deadlock", "retention batch failed")


class Workload:
    """IN_FLIGHT runs of LIVE at all times: each finished run is replaced by a new one
    until stop() (in-flight runs are still followed to their end)."""

    def __init__(self, cluster: Cluster) -> None:
        self.control = cluster.control()
        self.runs: list[UUID] = []
        self._stopping = asyncio.Event()

    async def run(self, enough: Callable[[int], bool] = lambda done: False) -> None:
        await self.control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=LIVE), metadata=ADMIN_AUTH, timeout=10
        )
        finished = 0

        async def slot() -> None:
            nonlocal finished
            while not self._stopping.is_set() and not enough(finished):
                started = await self.control.StartRun(
                    runs_pb2.StartRunRequest(workflow_name=LIVE.name),
                    metadata=ADMIN_AUTH,
                    timeout=10,
                )
                self.runs.append(UUID(started.run.id))
                # WatchRun ends once the run is terminal and its last event was sent.
                watch = runs_pb2.WatchRunRequest(run_id=started.run.id)
                async for _ in self.control.WatchRun(watch, metadata=ADMIN_AUTH, timeout=120):
                    pass
                finished += 1

        async with asyncio.TaskGroup() as group:
            for _ in range(IN_FLIGHT):
                group.create_task(slot())

    def stop(self) -> None:
        self._stopping.set()


async def throughput(cluster: Cluster, start: datetime, end: datetime) -> tuple[float, float]:
    """Live runs and tasks finished per second between start and end (database clock)."""
    runs = await cluster.fetchval(
        "SELECT count(*) FROM runs WHERE workflow_id IN (SELECT id FROM workflows"
        " WHERE name = $1) AND finished_at BETWEEN $2 AND $3",
        LIVE.name,
        start,
        end,
    )
    seconds = seconds_between(start, end)
    return runs / seconds, runs * len(LIVE.tasks) / seconds


class LockWaits:
    """Samples pg_stat_activity for backends of this database waiting on a row or
    transaction lock: the longest wait seen (who waited, for whom), and how many samples
    caught one."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self.longest_s = 0.0
        self.waiter = "nobody"
        self.caught = 0
        self.blockers: Counter[str] = Counter()

    async def sample(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            row = await self._cluster.fetchrow(
                "SELECT extract(epoch FROM clock_timestamp() - a.query_start)::float8 AS s,"
                "       split_part(a.application_name, ' ', 1) AS waiter, a.wait_event,"
                "       (SELECT string_agg(DISTINCT split_part(b.application_name, ' ', 1), ',')"
                "          FROM pg_stat_activity b"
                "         WHERE b.pid = ANY(pg_blocking_pids(a.pid))) AS blocker"
                "  FROM pg_stat_activity a"
                " WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'"
                "   AND a.wait_event IN ('tuple', 'transactionid', 'relation')"
                " ORDER BY a.query_start LIMIT 1"
            )
            if row is not None:
                self.caught += 1
                self.blockers[row["blocker"] or "?"] += 1
                if row["s"] > self.longest_s:
                    self.longest_s = row["s"]
                    self.waiter = (
                        f"{row['waiter']} on {row['wait_event']} held by {row['blocker'] or '?'}"
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)


async def test_pruning_a_large_backlog_leaves_live_work_alone(cluster: Cluster) -> None:
    seeding = time.monotonic()
    made = await backlog.seed(
        await cluster.pool(), BACKLOG_RUNS, tasks=BACKLOG_TASKS, finished_ago_s=40 * 86400
    )
    seed_s = time.monotonic() - seeding

    await cluster.start_server()
    await cluster.start_coordinator("quiet", extra=["--retention", "0"])
    await cluster.start_worker("w1", concurrency=4)
    await cluster.start_worker("w2", concurrency=4)

    # Without pruning: the same workload over the same tables.
    baseline = Workload(cluster)
    baseline_from = await cluster.db_now()
    await baseline.run(enough=lambda done: done >= BASELINE_RUNS)
    baseline_rate = await throughput(cluster, baseline_from, await cluster.db_now())
    assert len(await backlog.run_ids(await cluster.pool())) == BACKLOG_RUNS

    pruner = await cluster.start_coordinator(
        "pruner",
        expect_leader=False,
        extra=["--retention", "30d", "--retention-batch", str(BATCH)],
    )
    live = Workload(cluster)
    live_work = asyncio.create_task(live.run())
    sampling = asyncio.Event()
    waits = LockWaits(cluster)
    sampler = asyncio.create_task(waits.sample(sampling))
    try:
        await poll_until(lambda: len(live.runs) >= IN_FLIGHT, "the live workload to start")
        await cluster.process("quiet").stop()

        async def pruner_leads() -> bool:
            return await cluster.leader_pid() == pruner.pid

        await poll_until(pruner_leads, "the pruner to lead", within=10)
        pruning_from = await cluster.db_now()

        async def backlog_gone() -> bool:
            left = await cluster.fetchval("SELECT count(*) FROM runs WHERE started_by = 'backlog'")
            return left == 0

        await poll_until(backlog_gone, "the backlog to be pruned", within=240, interval=0.05)
        pruned_at = await cluster.db_now()
    finally:
        live.stop()
        await asyncio.wait_for(live_work, 120)
        sampling.set()
        await sampler

    prune_s = seconds_between(pruning_from, pruned_at)
    during_rate = await throughput(cluster, pruning_from, pruned_at)
    report_figure(
        f"RETENTION prune: {made.runs} runs / {made.rows} rows in {prune_s:.1f}s ="
        f" {made.runs / prune_s:.0f} runs/s, {made.rows / prune_s:.0f} rows/s"
        f" (batch {BATCH}; seeded in {seed_s:.1f}s)"
    )
    report_figure(
        f"RETENTION live: {during_rate[0]:.1f} runs/s ({during_rate[1]:.0f} tasks/s) while"
        f" pruning vs {baseline_rate[0]:.1f} runs/s ({baseline_rate[1]:.0f} tasks/s) without"
        f" ({during_rate[0] / baseline_rate[0]:.0%}); longest lock wait sampled"
        f" {waits.longest_s * 1000:.0f}ms, {waits.waiter} ({waits.caught} samples caught"
        f" one; held by {dict(waits.blockers)})"
    )

    # Everything of the backlog went, table by table.
    for table in ("attempts", "dispatches", "state_events", "tasks"):
        left = await cluster.fetchval(
            f"SELECT count(*) FROM {table} t JOIN runs r ON r.id = t.run_id"
            " WHERE r.started_by = 'backlog'"
        )
        assert left == 0, table
    assert await cluster.fetchval("SELECT count(*) FROM tasks") == len(LIVE.tasks) * (
        len(baseline.runs) + len(live.runs)
    )
    # Every live run is whole: all its tasks, every event 1..last_seq (checked again, with
    # everything else, by the invariant check).
    live_runs = baseline.runs + live.runs
    whole = await cluster.fetchval(
        "SELECT count(*) FROM runs r WHERE r.id = ANY($1)"
        " AND (SELECT count(*) FROM tasks t WHERE t.run_id = r.id) = $2"
        " AND (SELECT count(*) FROM state_events e WHERE e.run_id = r.id) = r.last_seq",
        live_runs,
        len(LIVE.tasks),
    )
    assert whole == len(live_runs)
    assert len(live.runs) >= IN_FLIGHT
    assert pruner.count_logged("retention pruned") >= 1
    for process in cluster.processes.values():
        log = process.output(current_only=False)
        found = [text for text in LOCK_ERRORS if text in log]
        assert not found, f"{process.name} logged {found}:\n{process.tail()}"
    await cluster.check_invariants(dict.fromkeys(live_runs, Expect()))
