"""Placement over real processes (docs/design.md §17): GPU reservations held by leases
never exceed a worker's resources, required labels are always honoured in a mixed pool,
sticky runs stick to their worker and fall back when it is killed with SIGKILL. Each
scenario ends with the invariant checker, whose placement invariants (kit.invariants
.placement) check every lease of the recorded history."""

from __future__ import annotations

from uuid import UUID

import pytest
import workload
from cluster import Cluster
from figures import report_figure
from probes import wait_attempt, wait_run

from awp_db.grant import PLACEMENT_FALLBACK_MS
from kit.invariants import Expect

pytestmark = pytest.mark.fault

GPU_TASKS = 24
CPU_TASKS = 16
GPUS = 2
GPU_FLAGS = ("--label", "gpu=a100", "--resource", f"gpu={GPUS}")


async def test_gpu_reservations_and_required_labels_in_a_mixed_pool(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    # More slots than GPUs: only the reservations bound the GPU work.
    gpu_workers = [
        await cluster.start_worker(f"gpu{i}", concurrency=6, extra=GPU_FLAGS) for i in range(2)
    ]
    await cluster.start_worker("cpu", concurrency=6)
    control = cluster.control()
    gpu = [
        workload.Task(
            f"g{i:03d}", (), {"sleep_ms": 150}, required_labels=("gpu=a100",), resources={"gpu": 1}
        )
        for i in range(GPU_TASKS)
    ]
    cpu = [workload.Task(f"c{i:03d}", (), {"sleep_ms": 50}) for i in range(CPU_TASKS)]
    run_id = await workload.start(control, workload.definition("mixed", [*gpu, *cpu]))
    await wait_run(cluster, run_id, within=180)
    await cluster.check_invariants({run_id: Expect()})
    gpu_ids = [UUID(handle.worker_id) for handle in gpu_workers]
    # The most GPU leases any worker held at once, from the recorded history (the
    # invariant checks it never passed the capacity; this shows the bound was reached).
    most = await cluster.fetchval(
        """SELECT max(n) FROM (
               SELECT (SELECT count(*) FROM dispatches e
                        WHERE e.worker_id = d.worker_id AND cardinality(e.resource_names) > 0
                          AND e.leased_at <= d.leased_at
                          AND (e.finished_at IS NULL OR e.finished_at > d.leased_at)) AS n
                 FROM dispatches d
                WHERE d.leased_at IS NOT NULL AND cardinality(d.resource_names) > 0) held"""
    )
    assert most == GPUS, most
    placed = await cluster.fetch(
        """SELECT DISTINCT a.worker_id FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE t.run_id = $1 AND t.key LIKE 'g%'""",
        run_id,
    )
    assert {row["worker_id"] for row in placed} <= set(gpu_ids)
    report_figure(
        f"PLACEMENT {GPU_TASKS} tasks needing gpu=1 and label gpu=a100 on two workers of"
        f" --resource gpu={GPUS} (6 slots each) beside a CPU worker and {CPU_TASKS} other"
        f" tasks: at most {most} GPU leases at once per worker, none on the CPU worker"
    )


STICKY_RUNS = 8


async def test_sticky_runs_stick_to_their_worker(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    for i in range(3):
        await cluster.start_worker(f"w{i}", concurrency=4)
    control = cluster.control()
    steps = [
        workload.Task("a", (), {"sleep_ms": 20}),
        workload.Task("b", ("a",), {"sleep_ms": 20}, sticky=True),
        workload.Task("c", ("b",), {"sleep_ms": 20}, sticky=True),
    ]
    definition = workload.definition("sticky", steps)
    runs = [await workload.start(control, definition) for _ in range(STICKY_RUNS)]
    for run_id in runs:
        await wait_run(cluster, run_id, within=120)
    await cluster.check_invariants({run_id: Expect() for run_id in runs}, report_each=False)
    rows = await cluster.fetch(
        """SELECT d.worker_id = d.sticky_worker AS stuck, d.leased_at >= d.prefer_until AS late
             FROM dispatches d WHERE d.sticky_worker IS NOT NULL AND d.leased_at IS NOT NULL"""
    )
    assert len(rows) == 2 * STICKY_RUNS
    # Every one went to its worker, or (a machine too busy for it to claim in time) to
    # another once the bound had passed -- which the invariant checker also holds.
    assert all(row["stuck"] or row["late"] for row in rows)
    stuck = sum(1 for row in rows if row["stuck"])
    assert stuck >= len(rows) // 2, f"only {stuck} of {len(rows)} stuck"
    report_figure(
        f"STICKY {STICKY_RUNS} runs a -> b -> c (b, c sticky) on 3 workers: {stuck} of"
        f" {len(rows)} sticky tasks ran on their run's previous worker"
    )


async def test_a_sticky_run_falls_back_when_its_worker_is_killed(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    first = await cluster.start_worker("first", concurrency=2)
    control = cluster.control()
    steps = [
        workload.Task("a", (), {"sleep_ms": 10}),
        # Long enough to be killed while running; its retry runs elsewhere.
        workload.Task("b", ("a",), {"sleep_ms": 3000}, sticky=True),
        workload.Task("c", ("b",), {"sleep_ms": 10}, sticky=True),
    ]
    run_id = await workload.start(control, workload.definition("fallback", steps))
    running = await wait_attempt(cluster, run_id, "b", 1, "running", within=60)
    assert running["worker_id"] == first.worker_id
    second = await cluster.start_worker("second", concurrency=2)
    first.process.kill()
    await wait_run(cluster, run_id, within=120)
    await cluster.check_invariants({run_id: Expect()})
    rows = await cluster.fetch(
        """SELECT t.key, a.attempt, a.worker_id::text AS worker_id, a.started_at,
                  d.sticky_worker::text AS sticky_worker, d.prefer_until
             FROM attempts a JOIN tasks t ON t.id = a.task_id
             JOIN dispatches d ON d.id = a.dispatch_id
            WHERE a.run_id = $1 ORDER BY a.started_at""",
        run_id,
    )
    final = {row["key"]: row for row in rows}
    assert final["a"]["worker_id"] == first.worker_id
    # b's retry preferred the dead worker (the run's last) and fell back to the live one.
    assert final["b"]["attempt"] > 1 and final["b"]["worker_id"] == second.worker_id
    assert final["b"]["sticky_worker"] == first.worker_id
    # c sticks to where b ran last.
    assert final["c"]["sticky_worker"] == second.worker_id == final["c"]["worker_id"]
    report_figure(
        "STICKY FALLBACK b's worker killed with SIGKILL mid-attempt: its retry"
        + (
            f" preferred the dead worker (still active) for its bound of {PLACEMENT_FALLBACK_MS} ms"
            if final["b"]["prefer_until"]
            else " preferred no one (its worker already offline)"
        )
        + " and ran on the other; c followed it there"
    )
