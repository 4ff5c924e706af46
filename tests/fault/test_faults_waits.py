"""Waits under real faults (docs/design.md §16), real processes and PostgreSQL: tasks
suspended at a sleep and then at a signal wait hold nothing, and a coordinator killed
with kill -9 and a server restarted while they wait lose no wait: every sleep ends on
the database clock, every signal sent afterwards resumes its task, and each step ran
once across the suspensions.
"""

from __future__ import annotations

from collections import Counter

import pytest
import workload
from cluster import ADMIN_AUTH, WORKER_TOKEN, Cluster, wait_for
from google.protobuf import struct_pb2
from probes import wait_run

from awp.v1 import durable_pb2
from awp_common.processes import command
from kit.invariants import Expect

pytestmark = pytest.mark.fault

ACTIONS = """
import os
from pathlib import Path

from awp_worker import ActionContext, action

SIDE = Path(os.environ["AWP_WAITS_DIR"])


def mark(ctx: ActionContext, step: str) -> str:
    with (SIDE / "executions.log").open("a") as log:
        log.write(f"{ctx.task_key} {step} {ctx.attempt}\\n")
    return step


@action("waits.agent")
def agent(ctx: ActionContext, input: dict) -> dict:
    ctx.step("before", mark, ctx, "before")
    ctx.sleep(input["sleep_s"])
    payload = ctx.wait_for_signal("go")
    ctx.step("after", mark, ctx, "after")
    return {"payload": payload}
"""

TASKS = 4


async def _waiting(cluster: Cluster, kind: str) -> bool:
    n = await cluster.fetchval(
        "SELECT count(*) FROM tasks WHERE state = 'waiting' AND wait_kind = $1", kind
    )
    return bool(n == TASKS)


async def test_a_coordinator_kill_9_and_a_server_restart_lose_no_wait(cluster: Cluster) -> None:
    side = cluster.dir / "waits"
    side.mkdir(parents=True, exist_ok=True)
    (cluster.dir / "waits_actions.py").write_text(ACTIONS)
    cluster.env["PYTHONPATH"] = str(cluster.dir)
    cluster.env["AWP_WAITS_DIR"] = str(side)
    server = await cluster.start_server()
    coordinator = await cluster.start_coordinator()
    await cluster.start_foreign_worker(
        "waiter",
        [
            *command("awp-worker"),
            "--server", cluster.server_address,
            "--worker-token", WORKER_TOKEN,
            "--name", "waiter",
            "--kinds", "python",
            "--module", "waits_actions",
            "--concurrency", "2",
            "--safety-margin", str(cluster.timings.safety_margin_s),
            "--log-format", "json",
        ],
    )  # fmt: skip
    definition = workload.definition("waits", workload.independent(TASKS, sleep_s=4))
    for task in definition.tasks:
        task.executor_kind, task.action = "python", "waits.agent"
    run_id = await workload.start(cluster.control(), definition)

    await wait_for(lambda: _waiting(cluster, "sleep"), "every task asleep", within=60)
    assert await cluster.fetchval("SELECT count(*) FROM dispatches WHERE state = 'leased'") == 0
    # The sleeps' timers live in PostgreSQL only: kill -9 the coordinator, restart the
    # server, and they still end (another coordinator's first pass finds them due).
    assert server.count_logged("unexpected error in handler") == 0, server.tail()
    coordinator.kill()
    await cluster.restart("server")
    await cluster.start_coordinator("coordinator-2")
    await wait_for(lambda: _waiting(cluster, "signal"), "every task at its signal", within=60)

    for n in range(TASKS):
        payload = struct_pb2.Value(number_value=n)
        await cluster.control().SendSignal(
            durable_pb2.SendSignalRequest(run_id=str(run_id), name="go", payload=payload),
            metadata=ADMIN_AUTH,
            timeout=10,
        )
    await wait_run(cluster, run_id, within=60)
    assert cluster.process("server").count_logged("unexpected error in handler") == 0
    lines = [line.split() for line in (side / "executions.log").read_text().splitlines()]
    assert Counter((task, step) for task, step, _ in lines) == Counter(
        {(f"t{i:03d}", step): 1 for i in range(TASKS) for step in ("before", "after")}
    ), "each step ran once across the suspensions"
    outputs = await cluster.fetch(
        "SELECT (output->>'payload')::float8 AS n FROM tasks WHERE run_id = $1", run_id
    )
    assert sorted(row["n"] for row in outputs) == list(range(TASKS))
    assert (
        await cluster.fetchval(
            "SELECT count(*) FROM attempts WHERE run_id = $1 AND state = 'suspended'", run_id
        )
        == 2 * TASKS
    )
    await cluster.check_invariants({run_id: Expect()})
