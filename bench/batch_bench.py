"""The job-queue use most users measure first: N single-task runs enqueued in one
StartRuns call (one transaction), run by the workers already waiting. The counterpart of
a peer's N jobs added in one batch: the clock starts just before the call, so the
enqueue is included, and stops at the last run's end (docs/performance.md, round 3)."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from cluster import Cluster, Window

from awp.v1 import control_pb2, runs_pb2, types_pb2


async def batch_enqueue(cluster: Cluster, window: Window, runs: int) -> dict[str, Any]:
    assert cluster.control is not None
    wf = types_pb2.WorkflowDefinition(name="batch", version=1)
    wf.tasks.add(key="only", executor_kind="mock", action="noop")
    await cluster.control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    request = runs_pb2.StartRunsRequest(
        runs=[
            runs_pb2.StartRunRequest(workflow_name=wf.name, request_id=f"batch-{i}")
            for i in range(runs)
        ]
    )
    await window.start()
    started = time.time()
    answer = await cluster.control.StartRuns(request, timeout=300)
    enqueued = time.time()
    rows = await cluster.wait_runs([UUID(run.run_id) for run in answer.runs])
    figures = await window.stop(runs)
    last = max(row["finished_at"].timestamp() for row in rows)
    figures["tasks_per_s"] = runs / (last - started)
    figures["enqueue_ms"] = (enqueued - started) * 1000
    return figures
