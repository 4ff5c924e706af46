"""The cost model's scenarios (issue 19, docs/performance.md "Cost model"): how time, CPU,
memory and database size grow with the size of a run, the number of runs at once and the
size of outputs. Each is a script-measured figure, one repetition by default.

* ``run_size``: one run of N tasks, 16 workers. Up to limits.MAX_TASKS (10,000) the
  definition lists the tasks; beyond, a source task's output holds a list of 1,000
  items and N / 1,000 map tasks fan out over it (each element its own task, created
  when the source succeeds). Figures: StartRun's latency, tasks/s from StartRun to the
  run's end, GetRun and one ListRuns page on the finished run (latency, answer size,
  tasks listed and left out), paging through every task with ListTasks, database bytes
  per task, peak RSS of each process.
* ``concurrent_runs``: R small runs (10 tasks) started at once (64 StartRun calls in
  flight), 4 workers: time to start them all, aggregate tasks/s, fairness (slowest
  run's end / the median run's, both counted from the first start) and the run
  durations' p50 / p99.
* ``payload``: N producers whose outputs are ~100 KB (the mock executor's
  ``output_bytes``) and N consumers, each depending on one producer: too large to travel
  inline in the lease, the upstream output is fetched by the worker
  (GetUpstreamOutputs). Figures: tasks/s, output MB/s, WAL MB per 1,000 tasks.
"""

from __future__ import annotations

import statistics
import time
from typing import Any
from uuid import UUID

from cluster import Cluster, Window

from awp.v1 import runs_pb2, types_pb2
from awp_protocol.limits import MAX_MAP_ELEMENTS, MAX_TASKS

COST_MODEL = ("run_size", "concurrent_runs", "payload")
PAYLOAD_BYTES = 100_000


def fan_out(name: str, tasks: int) -> types_pb2.WorkflowDefinition:
    """``tasks`` no-op tasks: listed when the definition can hold them, otherwise one
    source task and map tasks over its list of MAX_MAP_ELEMENTS items."""
    wf = types_pb2.WorkflowDefinition(name=name, version=1)
    if tasks <= MAX_TASKS:
        for i in range(tasks):
            wf.tasks.add(key=f"t{i:06d}", executor_kind="mock", action="noop")
        return wf
    source = wf.tasks.add(key="source", executor_kind="mock", action="noop")
    source.input.update({"items": list(range(MAX_MAP_ELEMENTS))})
    for i in range(tasks // MAX_MAP_ELEMENTS):
        task = wf.tasks.add(key=f"map{i:03d}", executor_kind="mock", action="noop")
        task.depends_on.append("source")
        task.map.over = "source"
        task.map.path = "echo.items"
    return wf


def payload_pairs(name: str, pairs: int) -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name=name, version=1)
    for i in range(pairs):
        producer = wf.tasks.add(key=f"p{i:05d}", executor_kind="mock", action="noop")
        producer.input.update({"output_bytes": PAYLOAD_BYTES})
        wf.tasks.add(
            key=f"c{i:05d}", executor_kind="mock", action="noop", depends_on=[producer.key]
        )
    return wf


async def _database_bytes(cluster: Cluster) -> int:
    rows = await cluster.query("SELECT pg_database_size(current_database()) AS n")
    return int(rows[0]["n"])


async def run_size(cluster: Cluster, window: Window, tasks: int) -> dict[str, Any]:
    assert cluster.control is not None
    wf = fan_out(f"size{tasks}", tasks)
    size0 = await _database_bytes(cluster)
    await window.start()
    started = time.perf_counter()
    (run_id,) = await cluster.start_runs(wf, 1)
    start_run_s = time.perf_counter() - started
    (row,) = await cluster.wait_runs([run_id], within=max(120.0, tasks / 50))
    counted = await cluster.query("SELECT count(*) AS n FROM tasks WHERE run_id = $1", run_id)
    total = int(counted[0]["n"])
    figures = await window.stop(total)
    started = time.perf_counter()
    got = await cluster.control.GetRun(runs_pb2.GetRunRequest(run_id=str(run_id)), timeout=60)
    get_run_s = time.perf_counter() - started
    started = time.perf_counter()
    listed = await cluster.control.ListRuns(runs_pb2.ListRunsRequest(), timeout=60)
    list_runs_s = time.perf_counter() - started
    started = time.perf_counter()
    paged = await _list_tasks(cluster, run_id)
    list_tasks_s = time.perf_counter() - started
    if paged != total:
        raise RuntimeError(f"ListTasks paged through {paged} tasks of {total}")
    figures.update(
        tasks_in_run=total,
        start_run_ms=start_run_s * 1000,
        tasks_per_s=total / (row["finished_at"] - row["created_at"]).total_seconds(),
        get_run_ms=get_run_s * 1000,
        get_run_kb=got.ByteSize() / 1024,
        get_run_tasks=len(got.tasks),
        list_runs_ms=list_runs_s * 1000,
        get_run_tasks_omitted=got.tasks_omitted,
        list_tasks_s=list_tasks_s,
        list_runs_kb=listed.ByteSize() / 1024,
        db_bytes_per_task=(await _database_bytes(cluster) - size0) / total,
    )
    return figures


async def _list_tasks(cluster: Cluster, run_id: UUID) -> int:
    """Pages through every task of the run as a client would; how many there were."""
    assert cluster.control is not None
    request = runs_pb2.ListTasksRequest(run_id=str(run_id))
    count = 0
    while True:
        page = await cluster.control.ListTasks(request, timeout=60)
        count += len(page.tasks)
        if not page.next_page_token:
            return count
        request.page_token = page.next_page_token


async def concurrent_runs(
    cluster: Cluster, window: Window, runs: int, tasks: int
) -> dict[str, Any]:
    wf = fan_out("small", tasks)
    await window.start()
    started = time.perf_counter()
    run_ids = await cluster.start_runs(wf, runs)
    start_all_s = time.perf_counter() - started
    rows = await cluster.wait_runs(run_ids, within=600)
    figures = await window.stop(runs * tasks)
    t0 = min(row["created_at"] for row in rows)
    ends = [(row["finished_at"] - t0).total_seconds() for row in rows]
    durations = sorted((row["finished_at"] - row["created_at"]).total_seconds() for row in rows)
    figures.update(
        start_all_s=start_all_s,
        tasks_per_s=runs * tasks / max(ends),
        fairness=max(ends) / statistics.median(ends),
        run_duration_p50_s=durations[len(durations) // 2],
        run_duration_p99_s=durations[min(len(durations) - 1, int(len(durations) * 0.99))],
    )
    return figures


async def payload(cluster: Cluster, window: Window, pairs: int) -> dict[str, Any]:
    wf = payload_pairs("payload", pairs)
    lsn = "SELECT pg_current_wal_lsn() AS lsn"
    wal0 = (await cluster.query(lsn))[0]["lsn"]
    await window.start()
    (run_id,) = await cluster.start_runs(wf, 1)
    (row,) = await cluster.wait_runs([run_id], within=300)
    figures = await window.stop(2 * pairs)
    wal1 = (await cluster.query(lsn))[0]["lsn"]
    wal = await cluster.query("SELECT pg_wal_lsn_diff($1, $2) AS n", wal1, wal0)
    seconds = (row["finished_at"] - row["created_at"]).total_seconds()
    figures.update(
        output_bytes=PAYLOAD_BYTES,
        tasks_per_s=2 * pairs / seconds,
        output_mb_per_s=pairs * PAYLOAD_BYTES / seconds / 1e6,
        wal_mb_per_1000_tasks=float(wal[0]["n"]) / 1e6 / (2 * pairs) * 1000,
    )
    return figures
