"""No deadlock and no INTERNAL answer under a multi-replica load (issue 25).

Two awp-server replicas, two coordinators (a leader and a standby), four workers split
between the replicas (two with GPUs, for the placed claims of a quarter of the tasks and
the sticky ones), and every kind of transaction at once for LOAD_S seconds: claims
batched across sessions, completions of successes and of failures that carry a
traceback (settlement plus diagnostics), retries, runs failing (the rest of the run
stopped while its leases are out), cancels of runs whose long steps are running,
heartbeats, a worker killed (lost stream, reaped leases, offline sweep) and another
drained (hand-backs), and retention pruning finished runs meanwhile. Tasks spend their
sleeps in memoised steps, so fenced memo writes (RecordStep) and replays meet all of it.

Every deadlock is a transaction PostgreSQL aborted and, where a handler ran it, an
INTERNAL answer: the contract says neither ever happens (DESIGN.md §6). The scenario
counts PostgreSQL's own tally for its database (pg_stat_database.deadlocks, read once
every process has gone and their backends have reported) and every INTERNAL the servers
logged; both must be 0, and the common invariant check (kit.invariants.health) runs too.

Before the fix (main at 1cd0bdc) this scenario counted 8 deadlocks and 8 INTERNAL answers
in 358 runs, every one a heartbeat's renewal holding one lease of a run while waiting for
another that a settlement held before stopping the failed run (tests/db/test_lock_order.py
replays it, and the other cycles, one by one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
from dataclasses import dataclass, field
from uuid import UUID

import grpc
import pytest
import workload
from cluster import ADMIN_AUTH, Cluster, wait_for
from figures import report_figure
from google.protobuf import duration_pb2

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2
from awp_common.processes import free_port
from kit.invariants.health import settled_deadlocks

pytestmark = pytest.mark.fault

WORKERS, CONCURRENCY = 4, 6
# Two of the workers have GPUs: w0, and w3, the one killed with SIGKILL (its reservations
# end with its leases).
GPU_WORKERS = ("w0", "w3")
GPU_LABELS = ("gpu=a100",)
GPU_FLAGS = ("--label", "gpu=a100", "--resource", "gpu=2")
LOAD_S = 60.0  # how long new runs keep coming; the test ends some 30-60 s later
IN_FLIGHT = 8  # runs kept going at once
# Many tasks per run, so that a worker's claims and completions meet on one run's lock.
FLAKY = workload.definition(
    "flaky",
    [
        workload.Task(
            f"t{i:02d}",
            (),
            {"fail_attempts": 2, "sleep_ms": i % 4 * 20, "steps": 2},
            # A quarter of them placed: claims that count reservations under the session
            # locks (awp_db.placement) meet all the rest, on the GPU workers.
            required_labels=GPU_LABELS if i % 4 == 0 else (),
            resources={"gpu": 1} if i % 4 == 0 else {},
        )
        for i in range(16)
    ],
    max_attempts=3,
)
# A failure stops the run while the same workers hold (and renew) its other branches.
DOOMED = workload.definition(
    "doomed",
    [
        workload.Task("start", (), {}),
        *(
            workload.Task(f"b{i}", ("start",), {"sleep_ms": 400, "steps": 4}, sticky=i % 2 == 0)
            for i in range(10)
        ),
        workload.Task("bad", ("start",), {"sleep_ms": 100, "fail": "doomed on purpose"}),
    ],
)
SLOW = workload.definition(
    "slow", [workload.Task(f"s{i}", (), {"sleep_ms": 4_000, "steps": 8}) for i in range(8)]
)


@dataclass
class Load:
    """Starts runs of the three workflows while the load lasts; cancels the slow ones
    once a step runs; prunes finished runs."""

    cluster: Cluster
    control: control_pb2_grpc.ControlServiceAsyncStub
    other: control_pb2_grpc.ControlServiceAsyncStub
    runs: list[UUID] = field(default_factory=list)
    canceled: int = 0
    pruned: int = 0

    async def slot(self, index: int, stop: asyncio.Event) -> None:
        kinds = random.Random(index)
        while not stop.is_set():
            workflow = kinds.choice((FLAKY, DOOMED, DOOMED, SLOW))
            run_id = await workload.start(self.control, workflow)
            self.runs.append(run_id)
            if workflow is SLOW:
                await self._running_step(run_id)
                await self.other.CancelRun(
                    runs_pb2.CancelRunRequest(run_id=str(run_id), reason="stress"),
                    metadata=ADMIN_AUTH,
                    timeout=10,
                )
                self.canceled += 1
            await wait_for(
                functools.partial(self._ended, run_id), f"run {run_id} to end", within=90
            )

    async def _ended(self, run_id: UUID) -> bool:
        state = await self.cluster.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
        return state != "running"  # None: pruned, so finished

    async def _running_step(self, run_id: UUID) -> None:
        await wait_for(
            lambda: self.cluster.fetchval(
                "SELECT count(*) > 0 FROM attempts WHERE run_id = $1", run_id
            ),
            f"a step of {run_id} to run",
            within=60,
        )

    async def prune(self, stop: asyncio.Event) -> None:
        older_than = duration_pb2.Duration()
        older_than.FromMilliseconds(200)
        while not stop.is_set():
            answer = await self.other.PruneRuns(
                control_pb2.PruneRunsRequest(older_than=older_than, limit=50),
                metadata=ADMIN_AUTH,
                timeout=30,
            )
            self.pruned += answer.runs
            # The pruner's cadence, not a wait for an event.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


async def _churn(cluster: Cluster) -> None:
    """A worker killed (its stream lost, its leases shortened and reaped, its session
    swept offline) and another drained (hand-backs), each started again."""
    await asyncio.sleep(LOAD_S / 3)  # when, under the load: not a wait for an event
    await cluster.restart("w3", graceful=False)
    await asyncio.sleep(LOAD_S / 3)
    await cluster.restart("w1")


def _internal_answers(cluster: Cluster) -> list[str]:
    return [
        line
        for process in cluster.processes.values()
        for line in process.output().splitlines()
        if "unexpected error in handler" in line
    ]


async def test_no_deadlock_and_no_internal_answer_under_multi_replica_load(
    cluster: Cluster,
) -> None:
    # Heartbeats (lease renewals) more often than elsewhere: more of them meet settlements.
    cluster.timings = dataclasses.replace(cluster.timings, heartbeat_s=0.1)
    await cluster.start_server("server")
    other_port = free_port()
    await cluster.start_server("server2", port=other_port)
    other_address = f"127.0.0.1:{other_port}"
    await cluster.start_coordinator("coordinator")
    await cluster.start_coordinator("standby", expect_leader=False)
    for i in range(WORKERS):
        address = cluster.server_address if i % 2 == 0 else other_address
        await cluster.start_worker(
            f"w{i}",
            concurrency=CONCURRENCY,
            server=address,
            extra=GPU_FLAGS if f"w{i}" in GPU_WORKERS else (),
        )
    load = Load(
        cluster,
        cluster.control(),
        control_pb2_grpc.ControlServiceStub(cluster.channel(other_address)),
    )
    stop = asyncio.Event()

    async def timer() -> None:
        await asyncio.sleep(LOAD_S)  # the load's length, not a wait for an event
        stop.set()

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(timer())
            group.create_task(_churn(cluster))
            group.create_task(load.prune(stop))
            for index in range(IN_FLIGHT):
                group.create_task(load.slot(index, stop))
    except* grpc.aio.AioRpcError as caught:
        raise AssertionError(f"a control call failed: {caught.exceptions}") from None

    internal = _internal_answers(cluster)
    failures = await cluster.fetchval("SELECT count(*) FROM attempts WHERE traceback IS NOT NULL")
    # PostgreSQL's full tally, once every backend has reported (at its exit).
    await cluster.close()
    deadlocks = await settled_deadlocks(cluster.dsn)
    report_figure(
        f"DEADLOCKS runs={len(load.runs)} canceled={load.canceled} pruned={load.pruned}"
        f" attempts_with_traceback_left={failures} deadlocks={deadlocks}"
        f" internal_answers={len(internal)}"
    )
    assert deadlocks == 0, f"PostgreSQL detected {deadlocks} deadlock(s)"
    assert not internal, "\n".join(internal[:5])
    # The common check too: the database's invariants, no deadlock, no INTERNAL.
    await cluster.check_invariants({})
