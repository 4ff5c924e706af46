"""Cancellation latency: CancelRun called -> the running action's cancellation observed.

One idle worker (production defaults: heartbeat every 5 s) runs one task at a time, a
``mock`` action sleeping for ten minutes. Once the worker logs that it executes it, the
run is canceled over the ControlService; the sample ends at the worker's "execution
cancelled" line for that run, written once the action's task has unwound its
CancelledError. Both ends are this machine's wall clock; the log's is to the
millisecond. The worker logs at debug level (the line that says the action started is a
debug line), a little more work for it than in production.

What it covers: the cancel request, the coordinator's convergence (woken by NOTIFY), the
revocation notice (migration 0012's trigger), the server's check and push down the
heartbeat stream, and the worker cancelling the executor. ``pushed_share`` is how many
of the revocations the server pushed (the rest waited for a heartbeat: up to 5 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from cluster import Cluster, Window
from processes import percentile, scrape, wait_for

from awp.v1 import control_pb2, runs_pb2, types_pb2

# The worker's log lines at the two ends (awp_worker._attempt).
STARTED = "executing "
CANCELLED = "execution cancelled"
PUSHED_METRIC = "awp_lease_revocations_pushed_total"


class LogTail:
    """The worker's JSON log lines about runs, read as they are written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        # (run_id, STARTED or CANCELLED) -> the line's time (epoch seconds).
        self.seen: dict[tuple[str, str], float] = {}

    def read(self) -> None:
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            message, run_id = line.get("msg", ""), line.get("run_id")
            for mark in (STARTED, CANCELLED):
                if run_id and message.startswith(mark):
                    stamp = line["ts"].replace("Z", "+00:00")
                    self.seen[(run_id, mark)] = _epoch(stamp)

    async def when(self, run_id: UUID, mark: str, within: float = 30.0) -> float:
        async def found() -> float | None:
            await asyncio.to_thread(self.read)
            return self.seen.get((str(run_id), mark))

        return await wait_for(found, f"{mark!r} of run {run_id}", within=within, every=0.005)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def cancel_latency(cluster: Cluster, window: Window, cancels: int) -> dict[str, Any]:
    assert cluster.control is not None
    control = cluster.control
    (worker,) = cluster.workers()
    tail = LogTail(worker.log)
    wf = types_pb2.WorkflowDefinition(name="cancel", version=1)
    task = wf.tasks.add(key="t", executor_kind="mock", action="noop")
    task.input.update({"sleep_ms": 600_000})
    task.timeout.FromMilliseconds(700_000)
    await control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    await window.start()
    pushed0 = (await asyncio.to_thread(scrape, cluster.server_metrics)).get((PUSHED_METRIC, ()), 0)
    samples = []
    for i in range(cancels):
        answer = await control.StartRun(
            runs_pb2.StartRunRequest(workflow_name=wf.name, request_id=f"cancel-{i}")
        )
        run_id = UUID(answer.run.id)
        await tail.when(run_id, STARTED)
        asked = time.time()
        await control.CancelRun(runs_pb2.CancelRunRequest(run_id=str(run_id), reason="bench"))
        samples.append((await tail.when(run_id, CANCELLED) - asked) * 1000)
    pushed1 = (await asyncio.to_thread(scrape, cluster.server_metrics)).get((PUSHED_METRIC, ()), 0)
    figures = await window.stop(cancels)
    figures["cancel_latency_ms_p50"] = percentile(samples, 50)
    figures["cancel_latency_ms_p99"] = percentile(samples, 99)
    figures["cancel_latency_ms_max"] = max(samples)
    figures["pushed_share"] = (pushed1 - pushed0) / cancels
    return figures
