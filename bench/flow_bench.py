"""Flow control (docs/design.md §17): what the grant rule's keyed limits and rate limits
cost dispatch, and how soon a freed unit is used again.

* ``flow``: RUNS runs of TASKS instant tasks, no limits (the baseline of the same shape);
* ``flow_limited``: the same, every task holding the concurrency key ``user:{input.user}``
  (max 2; one key per run: 100 keys) and charging one unit of a rate limit ``api`` set
  far above the load, so that neither binds and the figure is what checking them costs;
  then the lag: LAG_KEYS keys of max 1, LAG_TASKS tasks each sleeping LAG_SLEEP_MS, more
  slots than units, so each key runs one task after another: a task's start minus its
  predecessor's finish (database clock) is the time from a unit freeing to the next task
  of the key starting.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any
from uuid import UUID

from cluster import Cluster, Window
from google.protobuf import struct_pb2
from processes import percentile

from awp.v1 import control_pb2, limits_pb2, runs_pb2, types_pb2

LAG_KEYS = 4
LAG_TASKS = 25
LAG_SLEEP_MS = 20


def _workflow(
    name: str, tasks: int, *, key_max: int = 0, rate: bool = False, sleep_ms: int = 0
) -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name=name, version=1)
    for i in range(tasks):
        task = wf.tasks.add(key=f"t{i:04d}", executor_kind="mock", action="noop")
        if sleep_ms:
            task.input.update({"sleep_ms": sleep_ms})
        if key_max:
            task.concurrency_limits.add(key="user:{input.user}", max=key_max)
        if rate:
            task.rate_limits.add(limit="api", units="1")
    return wf


async def _start(cluster: Cluster, wf: types_pb2.WorkflowDefinition, runs: int) -> list[UUID]:
    control = cluster.control
    assert control is not None
    await control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))

    async def one(user: int) -> UUID:
        run_input = struct_pb2.Struct()
        run_input.update({"user": user})
        answer = await control.StartRun(
            runs_pb2.StartRunRequest(workflow_name=wf.name, input=run_input), timeout=300
        )
        return UUID(answer.run.id)

    return list(await asyncio.gather(*(one(user) for user in range(runs))))


async def flow(
    cluster: Cluster, window: Window, runs: int, tasks: int, *, limited: bool
) -> dict[str, Any]:
    control = cluster.control
    assert control is not None
    if limited:
        spec = limits_pb2.RateLimitSpec(name="api", units=10**12)
        spec.period.FromSeconds(60)
        await control.SetRateLimit(limits_pb2.SetRateLimitRequest(spec=spec))
    wf = _workflow("flow", tasks, key_max=2 if limited else 0, rate=limited)
    await window.start()
    run_ids = await _start(cluster, wf, runs)
    rows = await cluster.wait_runs(run_ids)
    figures = await window.stop(runs * tasks)
    t0 = min(row["created_at"] for row in rows)
    elapsed = max((row["finished_at"] - t0).total_seconds() for row in rows)
    figures["tasks_per_s"] = runs * tasks / elapsed
    figures["elapsed_s"] = elapsed
    if limited:
        lag = await _lag(cluster)
        figures["unit_reuse_ms_p50"] = percentile(lag, 50)
        figures["unit_reuse_ms_p99"] = percentile(lag, 99)
    return figures


async def _lag(cluster: Cluster) -> list[float]:
    wf = _workflow("flow-lag", LAG_TASKS, key_max=1, sleep_ms=LAG_SLEEP_MS)
    await cluster.wait_runs(await _start(cluster, wf, LAG_KEYS))
    rows = await cluster.query(
        """SELECT r.input ->> 'user' AS key, a.started_at, a.finished_at
             FROM attempts a JOIN runs r ON r.id = a.run_id
             JOIN workflows w ON w.id = r.workflow_id
            WHERE w.name = 'flow-lag' ORDER BY 1, a.started_at"""
    )
    lags: list[float] = []
    for previous, row in itertools.pairwise(rows):
        if previous["key"] == row["key"]:
            lags.append((row["started_at"] - previous["finished_at"]).total_seconds() * 1000)
    return lags
