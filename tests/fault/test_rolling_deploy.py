"""A full rolling deploy under load, over real processes (issue 15): it must lose nothing
and cost nothing.

2 awp-server processes behind a TCP load balancer (balancer.py, what a Kubernetes Service
does), 2 coordinators, 4 workers. Runs of layered 1-3 s mock steps are kept in flight
while every process is replaced one at a time, twice: servers (the new one serving before
the old is retired), then coordinators (a new standby before the old stops), then workers
(a new one registered before the old is sent SIGTERM). Every task allows one attempt, so
a deploy that charged any task an attempt would fail its run.

Workers drain with a shutdown grace shorter than the longest steps: what finishes in
time is completed, the rest is handed back free of charge and runs again elsewhere.

Figures: runs failed (0), attempts charged by hand-backs (0), tasks re-executed, the
longest time a ready task waited for a worker (a figure, not asserted: timing goals
belong in benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from uuid import UUID

import grpc
import pytest
import workload
from balancer import LoadBalancer
from cluster import ADMIN_AUTH, Cluster, WorkerProcess, wait_for
from figures import report_figure
from probes import wait_run
from process import Process

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_common.processes import free_port, free_ports
from kit.invariants import Expect

pytestmark = pytest.mark.fault

ROUNDS = 2
SERVERS, COORDINATORS, WORKERS = 2, 2, 4
CONCURRENCY = 10  # per worker: 40 slots, more than the load ever asks for at once
# Runs kept in flight while the deploy rolls: each a DAG of LAYERS x WIDTH steps whose
# tasks wait for two of the layer above, so at most WIDTH of a run's run at once (30 of
# all). The first ACTIVE_RUNS alone are 360 tasks, some 30 s of work each.
ACTIVE_RUNS, LAYERS, WIDTH = 6, 12, 5
MAX_RUNS = 30  # the load's bound, whatever the machine's pace
STEP_MS = (1_000, 3_000)
# Shorter than the longest steps: a drain completes some leases and hands others back.
SHUTDOWN_GRACE_S = 1.5
WORKFLOW = "rolling"


def _workflow() -> types_pb2.WorkflowDefinition:
    steps = random.Random(15)
    tasks = [
        workload.Task(task.key, task.depends_on, {"sleep_ms": steps.randint(*STEP_MS)})
        for task in workload.layers(LAYERS, WIDTH)
    ]
    return workload.definition(WORKFLOW, tasks, max_attempts=1)


async def _through_balancer(call: Callable[[], Awaitable[object]], what: str) -> object:
    """A control call a client retries while its server is being replaced."""

    async def attempt() -> object:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None

    return await wait_for(attempt, what)


@dataclass
class Load:
    """Keeps ACTIVE_RUNS runs going, as users keep starting work during a deploy."""

    cluster: Cluster
    control: control_pb2_grpc.ControlServiceAsyncStub
    runs: list[UUID] = field(default_factory=list)

    async def start_run(self) -> None:
        request = runs_pb2.StartRunRequest(
            workflow_name=WORKFLOW, request_id=f"rolling-{len(self.runs)}"
        )
        # The same request id: a retried StartRun never starts a second run.
        response = await _through_balancer(
            lambda: self.control.StartRun(request, metadata=ADMIN_AUTH, timeout=10), "StartRun"
        )
        assert isinstance(response, runs_pb2.StartRunResponse)
        self.runs.append(UUID(response.run.id))

    async def keep_going(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and len(self.runs) < MAX_RUNS:
            running = await self.cluster.fetchval(
                "SELECT count(*) FROM runs WHERE state = 'running'"
            )
            for _ in range(min(ACTIVE_RUNS - running, MAX_RUNS - len(self.runs))):
                await self.start_run()
            # The load's cadence, not a wait for an event.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


@dataclass
class Fleet:
    """The processes of the current release, by role."""

    servers: list[tuple[Process, int]] = field(default_factory=list)
    coordinators: list[Process] = field(default_factory=list)
    workers: list[WorkerProcess] = field(default_factory=list)
    # Each drained worker: its session, and when it was sent SIGTERM (database clock).
    drained: list[tuple[str, object]] = field(default_factory=list)
    replacements: int = 0


async def _stopped_cleanly(process: Process) -> None:
    process.terminate()
    code = await process.wait_exit(30)
    assert code == 0, f"{process.name} exited {code}:\n{process.tail()}"


async def _roll(cluster: Cluster, lb: LoadBalancer, fleet: Fleet, release: int) -> None:
    for index, (old, old_port) in enumerate(list(fleet.servers)):
        port = free_port()
        new = await cluster.start_server(f"server-r{release}.{index}", port=port)
        lb.add(port)
        lb.remove(old_port)
        await _stopped_cleanly(old)
        fleet.servers[index] = (new, port)
        fleet.replacements += 1
    for index, old in enumerate(list(fleet.coordinators)):
        fleet.coordinators[index] = await cluster.start_coordinator(
            f"coordinator-r{release}.{index}", expect_leader=False
        )
        await _stopped_cleanly(old)
        await wait_for(cluster.leader_pid, "a coordinator to lead")
        fleet.replacements += 1
    for index, old_worker in enumerate(list(fleet.workers)):
        fleet.workers[index] = await _start_worker(cluster, lb, f"worker-r{release}.{index}")
        fleet.drained.append((old_worker.worker_id, await cluster.db_now()))
        await _stopped_cleanly(old_worker.process)
        fleet.replacements += 1


async def _start_worker(cluster: Cluster, lb: LoadBalancer, name: str) -> WorkerProcess:
    return await cluster.start_worker(
        name, concurrency=CONCURRENCY, server=lb.address, shutdown_grace=SHUTDOWN_GRACE_S
    )


async def test_a_rolling_deploy_under_load_loses_nothing_and_costs_nothing(
    cluster: Cluster,
) -> None:
    lb = await LoadBalancer().start()
    try:
        await _deploy_twice(cluster, lb)
    finally:
        await lb.close()


async def _deploy_twice(cluster: Cluster, lb: LoadBalancer) -> None:
    fleet = Fleet()
    for index in range(SERVERS):
        port = free_port()
        fleet.servers.append((await cluster.start_server(f"server-r0.{index}", port=port), port))
        lb.add(port)
    for index in range(COORDINATORS):
        fleet.coordinators.append(
            await cluster.start_coordinator(f"coordinator-r0.{index}", expect_leader=index == 0)
        )
    for index in range(WORKERS):
        fleet.workers.append(await _start_worker(cluster, lb, f"worker-r0.{index}"))

    control = control_pb2_grpc.ControlServiceStub(cluster.channel(lb.address))
    await _through_balancer(
        lambda: control.CreateWorkflow(
            control_pb2.CreateWorkflowRequest(definition=_workflow()),
            metadata=ADMIN_AUTH,
            timeout=10,
        ),
        "CreateWorkflow",
    )
    load = Load(cluster, control)
    stop = asyncio.Event()
    feeding = asyncio.create_task(load.keep_going(stop))
    try:
        await wait_for(
            lambda: cluster.fetchval("SELECT count(*) >= $1 FROM attempts", WIDTH * ACTIVE_RUNS),
            "the load to be running",
        )
        started = time.monotonic()
        for release in range(1, ROUNDS + 1):
            await _roll(cluster, lb, fleet, release)
        rolled_in = time.monotonic() - started
    finally:
        stop.set()
        await feeding
    for run_id in load.runs:
        await wait_run(cluster, run_id, within=120)

    figures = await _figures(cluster, load.runs, fleet)
    report_figure(
        f"ROLLING deploy x{ROUNDS} ({fleet.replacements} replacements in {rolled_in:.1f}s,"
        f" {len(load.runs)} runs, {figures['tasks']} tasks of 1-3s, max_attempts=1):"
        f" runs failed={figures['runs_failed']}"
        f" hand-backs={figures['hand_backs']} charged={figures['charged']}"
        f" re-executed tasks={figures['re_executed']}"
        f" (extra attempts={figures['extra_attempts']})"
        f" completed while draining={figures['drained_completions']}"
        f" longest ready wait for a worker={figures['max_ready_wait_s']:.2f}s"
        f" lb connections={sum(lb.routed.values())} refused={lb.refused}"
    )
    assert figures["runs_failed"] == 0
    assert figures["charged"] == 0
    # Both ways out of a drain were taken: finishing in time, and a free hand-back.
    assert figures["hand_backs"] > 0 and figures["drained_completions"] > 0
    # Nothing else cost an execution: every extra attempt follows a hand-back.
    assert figures["extra_attempts"] == figures["hand_backs"]
    await cluster.check_invariants({run_id: Expect() for run_id in load.runs}, report_each=False)


async def _figures(cluster: Cluster, runs: list[UUID], fleet: Fleet) -> dict[str, float]:
    row = await cluster.fetchrow(
        """
        WITH per_task AS (
            SELECT t.id, count(a.id) AS made
              FROM tasks t JOIN attempts a ON a.task_id = t.id
             WHERE t.run_id = ANY($1::uuid[]) GROUP BY t.id)
        SELECT (SELECT count(*) FROM runs WHERE id = ANY($1::uuid[]) AND state <> 'succeeded')
                   AS runs_failed,
               (SELECT count(*) FROM tasks WHERE run_id = ANY($1::uuid[])) AS tasks,
               (SELECT count(*) FILTER (WHERE made > 1) FROM per_task) AS re_executed,
               (SELECT coalesce(sum(made - 1), 0) FROM per_task) AS extra_attempts
        """,
        runs,
    )
    assert row is not None
    figures: dict[str, float] = dict(row)
    hand_backs = await cluster.fetchrow(
        """
        SELECT count(*) AS hand_backs,
               count(*) FILTER (WHERE (payload->'hand_back'->>'charged')::bool) AS charged
          FROM state_events
         WHERE run_id = ANY($1::uuid[]) AND type = 'attempt.state' AND payload ? 'hand_back'
        """,
        runs,
    )
    assert hand_backs is not None
    figures.update(dict(hand_backs))
    # Results a worker reported after its SIGTERM: work its drain let finish.
    figures["drained_completions"] = 0
    for worker_id, signalled_at in fleet.drained:
        figures["drained_completions"] += await cluster.fetchval(
            """SELECT count(*) FROM attempts
                WHERE worker_id = $1::uuid AND state = 'succeeded' AND finished_at > $2""",
            worker_id,
            signalled_at,
        )
    # From each time a task became ready to the start of its next attempt.
    figures["max_ready_wait_s"] = await cluster.fetchval(
        """
        SELECT coalesce(extract(epoch FROM max(created_at - ready_since)), 0)::float8
          FROM (SELECT created_at, to_state,
                       max(created_at) FILTER (WHERE to_state = 'ready')
                           OVER (PARTITION BY run_id, task_key ORDER BY seq) AS ready_since
                  FROM state_events
                 WHERE run_id = ANY($1::uuid[]) AND type = 'task.state') e
         WHERE to_state = 'running'
        """,
        runs,
    )
    return figures


async def test_a_worker_whose_server_stops_with_it_drains_through_another(
    cluster: Cluster,
) -> None:
    """The server and the worker stop together (one pod each of a rollout): the worker
    finishes its drain through the next server of its list and exits 0."""
    # Chosen together: two free_port() calls in a row may return the same port.
    first, second = free_ports(2)
    server = await cluster.start_server("server-a", port=first)
    await cluster.start_server("server-b", port=second)
    await cluster.start_coordinator()
    worker = await cluster.start_worker(
        "w1",
        concurrency=2,
        server=f"127.0.0.1:{first},127.0.0.1:{second}",
        shutdown_grace=3.0,
    )
    run_id = await workload.start(
        control_pb2_grpc.ControlServiceStub(cluster.channel(f"127.0.0.1:{second}")),
        workload.definition(
            "failover",
            [
                workload.Task("quick", input={"sleep_ms": 2_000}),
                workload.Task("long", input={"sleep_ms": 6_000}),
            ],
            max_attempts=1,
        ),
    )
    await wait_for(
        lambda: cluster.fetchval(
            "SELECT count(*) = 2 FROM attempts WHERE run_id = $1 AND state = 'running'", run_id
        ),
        "both tasks running on w1",
    )
    signalled = time.monotonic()
    server.terminate()
    worker.process.terminate()
    assert await server.wait_exit(30) == 0
    code = await worker.process.wait_exit(30)
    assert code == 0, worker.process.tail()
    report_figure(
        f"DRAIN FAILOVER server+worker SIGTERM together -> worker exit 0 in"
        f" {time.monotonic() - signalled:.2f}s (shutdown grace 3s)"
    )
    assert worker.process.count_logged("unreachable") >= 1
    # Retries are warnings; nothing failed (the issue: "ERROR ... Drain failed", exit 1).
    errors = [line for line in worker.process.json_lines() if line.get("level") == "error"]
    assert not errors, errors

    rows = await cluster.fetch(
        """SELECT t.key, a.attempt, a.state, a.worker_id::text AS worker_id
             FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE a.run_id = $1 ORDER BY t.key, a.attempt""",
        run_id,
    )
    assert [(r["key"], r["attempt"], r["state"], r["worker_id"]) for r in rows] == [
        ("long", 1, "interrupted", worker.worker_id),
        ("quick", 1, "succeeded", worker.worker_id),
    ]
    # Handed back free of charge: the one-attempt task runs again on the next worker.
    await cluster.start_worker("w2", concurrency=1, server=f"127.0.0.1:{second}")
    await wait_run(cluster, run_id)
    await cluster.check_invariants({run_id: Expect()})
