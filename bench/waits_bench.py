"""Waits (docs/design.md §16): what a suspended task costs to resume, and what 10,000
waiting tasks cost the coordinator.

Each run is one mock task that first sleeps ``SLEEP_MS`` as a durable wait (``ctx.sleep``:
attempt 1 suspends), then waits for the signal ``go`` (attempt 2 suspends); the script
sends the signal once the task waits for it, and attempt 3 finishes. One worker, runs
one after another. Figures, on the database clock:

* ``signal_to_running_ms``: SendSignal called (the database clock read just before)
  -> attempt 3 started, p50/p99: the signal's transaction, the coordinator woken by
  NOTIFY, a dispatch, the worker's claim;
* ``sleep_lateness_ms``: the sleep's due time -> attempt 2 started, p50/p99: the
  coordinator's timer (its next pass scheduled for the earliest due time), the dispatch
  and the claim;
* ``pass_ms_idle`` / ``pass_ms_10k_waiting``: the mean coordinator pass
  (``awp_coordinator_pass_seconds``) over ``PASS_WINDOW_S`` with no task, then with
  ``WAITING`` approval wait tasks (each with a timeout, so the due-time index holds them
  all) waiting at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID

from cluster import Cluster, Window
from processes import percentile, scrape, wait_for

from awp.v1 import control_pb2, durable_pb2, runs_pb2, types_pb2

SLEEP_MS = 300
WAITING = 10_000
PASS_WINDOW_S = 10.0


def _agent() -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name="waits", version=1)
    task = wf.tasks.add(key="agent", executor_kind="mock", action="noop")
    task.input.update({"wait_sleep_ms": SLEEP_MS, "wait_signal": "go"})
    return wf


def _gates() -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name="gates", version=1)
    for i in range(WAITING):
        task = wf.tasks.add(key=f"g{i:05d}")
        task.wait.kind = types_pb2.CHECKPOINT_KIND_APPROVAL
        task.wait.prompt = "?"
        task.wait.timeout.FromSeconds(86_400)
    return wf


async def _waiting_for(cluster: Cluster, run_id: UUID, kind: str) -> bool:
    rows = await cluster.query(
        "SELECT wait_kind FROM tasks WHERE run_id = $1 AND state = 'waiting'", run_id
    )
    return bool(rows) and rows[0]["wait_kind"] == kind


async def _mean_pass_ms(cluster: Cluster) -> float:
    def sample() -> tuple[float, float]:
        found = scrape(cluster.coordinator_metrics)
        return (
            found.get(("awp_coordinator_pass_seconds_sum", ()), 0.0),
            found.get(("awp_coordinator_pass_seconds_count", ()), 0.0),
        )

    total0, count0 = await asyncio.to_thread(sample)
    await asyncio.sleep(PASS_WINDOW_S)
    total1, count1 = await asyncio.to_thread(sample)
    return (total1 - total0) / max(count1 - count0, 1.0) * 1000


async def waits(cluster: Cluster, window: Window, runs: int) -> dict[str, Any]:
    assert cluster.control is not None
    wf = _agent()
    await cluster.control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    await window.start()
    resumed: list[float] = []
    late: list[float] = []
    for i in range(runs):
        answer = await cluster.control.StartRun(
            runs_pb2.StartRunRequest(workflow_name=wf.name, request_id=f"waits-{i}")
        )
        run_id = UUID(answer.run.id)
        await wait_for(
            lambda run_id=run_id: _waiting_for(cluster, run_id, "signal"),
            f"run {run_id} waiting for its signal",
            within=120,
        )
        sent_at = (await cluster.query("SELECT clock_timestamp() AS t"))[0]["t"]
        await cluster.control.SendSignal(
            durable_pb2.SendSignalRequest(run_id=str(run_id), name="go")
        )
        await cluster.wait_runs([run_id], within=120)
        rows = await cluster.query(
            "SELECT attempt, state, started_at FROM attempts WHERE run_id = $1 ORDER BY attempt",
            run_id,
        )
        states = [(row["attempt"], row["state"]) for row in rows]
        if states != [(1, "suspended"), (2, "suspended"), (3, "succeeded")]:
            raise RuntimeError(f"run {run_id}: attempts {states}")
        woke = await cluster.query(
            "SELECT value::text AS v FROM checkpoints WHERE run_id = $1 AND kind = 'sleep'",
            run_id,
        )
        due = await cluster.query(
            "SELECT $1::text::timestamptz AS t", json.loads(woke[0]["v"])["woke_at"]
        )
        late.append((rows[1]["started_at"] - due[0]["t"]).total_seconds() * 1000)
        resumed.append((rows[2]["started_at"] - sent_at).total_seconds() * 1000)
    figures = await window.stop(runs)
    figures["signal_to_running_ms_p50"] = percentile(resumed, 50)
    figures["signal_to_running_ms_p99"] = percentile(resumed, 99)
    figures["sleep_lateness_ms_p50"] = percentile(late, 50)
    figures["sleep_lateness_ms_p99"] = percentile(late, 99)
    # The coordinator's pass, idle and then with WAITING tasks waiting.
    figures["pass_ms_idle"] = await _mean_pass_ms(cluster)
    gates = _gates()
    await cluster.control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=gates))
    started = await cluster.control.StartRun(runs_pb2.StartRunRequest(workflow_name="gates"))

    async def all_waiting() -> bool:
        rows = await cluster.query(
            "SELECT count(*) AS n FROM tasks WHERE run_id = $1 AND state = 'waiting'",
            UUID(started.run.id),
        )
        return bool(rows[0]["n"] == WAITING)

    await wait_for(all_waiting, f"{WAITING} wait tasks waiting", within=300)
    figures["waiting_tasks"] = float(WAITING)
    figures["pass_ms_10k_waiting"] = await _mean_pass_ms(cluster)
    return figures
