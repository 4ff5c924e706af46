"""A poison result among coalesced ones (issue 13, item 4), with real processes.

A python action raises an error whose message holds a NUL, which PostgreSQL text cannot
store. It finishes first, before 7 good results, all 8 in one coalesced Complete. The
server refuses that Complete as bad input (INVALID_ARGUMENT naming the result, never
INTERNAL); the worker bisects it, the 7 good results are recorded, and only then is the
refused one reported as a failure carrying the server's reason, so the task follows its
retry rule and the run finishes instead of 8 tasks staying RUNNING behind a Complete
resent forever. With one attempt that failure fails the run at once (fail fast), which
revokes every lease still held: reported first, it would throw the 7 finished results
away as LEASE_LOST and end their tasks CANCELED (issue 25.5).
"""

from __future__ import annotations

import time

import pytest
import workload
from cluster import WORKER_TOKEN, Cluster
from figures import report_figure
from probes import wait_run

from awp_common.processes import command
from kit.invariants import Expect

pytestmark = pytest.mark.fault

ACTIONS = """
import asyncio

from awp_worker import ActionContext, RetryableError, action


@action("poison.step")
async def step(ctx: ActionContext, input: dict) -> dict:
    # Long enough for all 8 leases to be claimed before the first one finishes; the
    # poison first, so that it leads the coalesced batch.
    if input["poison"]:
        await asyncio.sleep(0.3)
        raise RetryableError("bad\\x00byte")
    await asyncio.sleep(0.6)
    return {"ok": True}
"""
TASKS = 8
POISON = "t003"


async def test_a_poison_result_among_eight_coalesced_is_isolated(cluster: Cluster) -> None:
    (cluster.dir / "poison_actions.py").write_text(ACTIONS)
    cluster.env["PYTHONPATH"] = str(cluster.dir)
    await cluster.start_server()
    await cluster.start_coordinator()
    worker = await cluster.start_foreign_worker(
        "poison-worker",
        [
            *command("awp-worker"),
            "--server", cluster.server_address,
            "--worker-token", WORKER_TOKEN,
            "--name", "poison-worker",
            "--kinds", "python",
            "--module", "poison_actions",
            "--concurrency", str(TASKS),
            "--flush-size", str(TASKS),
            # Only a full batch (or every held lease reported) flushes: all 8 go together.
            "--flush-interval", "10",
            "--safety-margin", str(cluster.timings.safety_margin_s),
            "--log-format", "json",
        ],
    )  # fmt: skip
    definition = workload.definition(
        "poison", workload.independent(TASKS, poison=False), max_attempts=1
    )
    for task in definition.tasks:
        task.executor_kind, task.action = "python", "poison.step"
        task.input["poison"] = task.key == POISON
    began = time.monotonic()
    run_id = await workload.start(cluster.control(), definition)
    await wait_run(cluster, run_id, "failed")
    took = time.monotonic() - began

    log = worker.process
    assert log.count_logged(f"Complete of {TASKS} results refused") == 1
    assert log.count_logged("reporting it as failed instead") == 1
    # Every good result was accepted: none arrived after the run had failed.
    assert log.count_logged("lease lost before the result arrived") == 0
    states = await cluster.fetch("SELECT key, state, error FROM tasks WHERE run_id = $1", run_id)
    assert sorted(row["key"] for row in states if row["state"] == "succeeded") == [
        f"t{i:03d}" for i in range(TASKS) if f"t{i:03d}" != POISON
    ]
    good = await cluster.fetch(
        """
        SELECT a.state FROM attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.run_id = $1 AND t.key <> $2
        """,
        run_id,
        POISON,
    )
    assert [row["state"] for row in good] == ["succeeded"] * (TASKS - 1)
    attempts = await cluster.fetch(
        """
        SELECT a.state, a.error FROM attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.run_id = $1 AND t.key = $2 ORDER BY a.attempt
        """,
        run_id,
        POISON,
    )
    # Each attempt failed with the server's reason, not interrupted after a lost lease.
    assert [row["state"] for row in attempts] == ["failed"]
    for row in attempts:
        assert "results[0].error.message: must not contain NUL characters" in row["error"]
        assert "the action's error began: bad\\\\x00byte" in row["error"]
    await cluster.check_invariants(
        {
            run_id: Expect(
                run_state="failed", task_states={POISON: "failed"}, default_task_state="succeeded"
            )
        }
    )
    report_figure(
        f"POISON {TASKS} coalesced results, 1 refused: run finished in {took:.2f} s, "
        f"{TASKS - 1} accepted, 1 failed after {len(attempts)} attempts"
    )
