"""Step checkpoints (docs/design.md §16): what a task with STEPS memoised steps costs to
run, and to run again from its memos.

Each run is one mock task of STEPS steps (the mock's ``steps``: each a ``ctx.step``,
doing nothing) that fails retryably after its steps on attempt 1 (``fail_attempts``) and
succeeds on attempt 2, with no backoff, one worker. Attempt 1 runs every step and
stores each memo (one fenced RecordStep transaction a step); attempt 2 loads them all
(LoadCheckpoints) and replays them without running a step. Figures, on the database
clock (attempt started_at -> finished_at, which includes the claim's hand-off and the
result's report): the first execution, and the re-execution, p50/p99 over the runs.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from cluster import Cluster, Window
from processes import percentile

from awp.v1 import control_pb2, runs_pb2, types_pb2

STEPS = 100


def _workflow() -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name="replay", version=1)
    task = wf.tasks.add(key="agent", executor_kind="mock", action="noop")
    task.input.update({"steps": STEPS, "fail_attempts": 1})
    task.retry.max_attempts = 2
    task.retry.initial_backoff.FromMilliseconds(0)
    task.retry.max_backoff.FromMilliseconds(1000)
    task.retry.backoff_multiplier = 2.0
    return wf


async def replay(cluster: Cluster, window: Window, runs: int) -> dict[str, Any]:
    """Runs one after another, each once the previous has finished."""
    assert cluster.control is not None
    wf = _workflow()
    await cluster.control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    await window.start()
    first: list[float] = []
    again: list[float] = []
    for i in range(runs):
        answer = await cluster.control.StartRun(
            runs_pb2.StartRunRequest(workflow_name=wf.name, request_id=f"replay-{i}")
        )
        run_id = UUID(answer.run.id)
        await cluster.wait_runs([run_id], within=120)
        rows = await cluster.query(
            """SELECT a.attempt, a.state, a.started_at, a.finished_at, t.saved_steps
                 FROM attempts a JOIN tasks t ON t.id = a.task_id
                WHERE a.run_id = $1 ORDER BY a.attempt""",
            run_id,
        )
        states = [(row["attempt"], row["state"]) for row in rows]
        if states != [(1, "failed"), (2, "succeeded")] or rows[1]["saved_steps"] != STEPS:
            raise RuntimeError(f"run {run_id}: attempts {states}, saved {rows[1]['saved_steps']}")
        for row, into in zip(rows, (first, again), strict=True):
            into.append((row["finished_at"] - row["started_at"]).total_seconds() * 1000)
    figures = await window.stop(runs)
    figures["replay_steps"] = float(STEPS)
    figures["first_run_ms_p50"] = percentile(first, 50)
    figures["first_run_ms_p99"] = percentile(first, 99)
    figures["replay_ms_p50"] = percentile(again, 50)
    figures["replay_ms_p99"] = percentile(again, 99)
    return figures
