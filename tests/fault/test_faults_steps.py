"""Step checkpoints under real faults (docs/design.md §16), real processes and PostgreSQL.

kill -9 a worker after 2 of a task's 3 steps: the next attempt, on another worker,
replays the two memos and runs only step 3 (every execution of a step is a line of a
side file), and the run reports what the memos saved (GetRun Task.saved).

SIGSTOP a worker inside a step, let its lease expire and the task run elsewhere, then
SIGCONT: the frozen attempt's memo write is refused LEASE_LOST (logged by the server and
by the worker, and stopping the attempt), and only the live attempt's memo is stored --
the invariant checker's "no checkpoint stored by a stale attempt" holds.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from uuid import UUID

import pytest
import workload
from cluster import ADMIN_AUTH, WORKER_TOKEN, Cluster, WorkerProcess, wait_for
from probes import wait_run

from awp.v1 import runs_pb2
from awp_common.processes import command
from kit.invariants import Expect

pytestmark = pytest.mark.fault

ACTIONS = """
import os
import time
from pathlib import Path

from awp_worker import ActionContext, action

SIDE = Path(os.environ["AWP_STEPS_DIR"])


def model(ctx: ActionContext, step: str, tokens: int) -> dict:
    # One line per execution of a step, written before it returns (what a crash re-pays).
    with (SIDE / "executions.log").open("a") as log:
        log.write(f"{ctx.task_key} {step} {ctx.attempt}\\n")
    return {"step": step, "tokens": tokens}


def usage(result: dict) -> dict:
    return {"tokens": result["tokens"], "cost_usd": result["tokens"] / 1_000_000}


@action("steps.agent")
def agent(ctx: ActionContext, input: dict) -> dict:
    plan = ctx.step("plan", model, ctx, "plan", 1000, usage=usage)
    draft = ctx.step("draft", model, ctx, "draft", 2000, usage=usage)
    if input.get("hang") and ctx.attempt == 1:
        (SIDE / f"{ctx.task_key}.two-done").touch()
        while True:  # killed here
            time.sleep(0.05)
    review = ctx.step("review", model, ctx, "review", 500, usage=usage)
    return {"steps": [plan["step"], draft["step"], review["step"]]}


@action("steps.slow")
def slow(ctx: ActionContext, input: dict) -> dict:
    def work() -> dict:
        if ctx.attempt == 1:
            (SIDE / "inside").touch()
            # Held inside the step until the test releases it (after the freeze).
            while not (SIDE / "release").exists():
                time.sleep(0.02)
        return {"by": ctx.attempt}

    return ctx.step("work", work)
"""


def _setup(cluster: Cluster) -> Path:
    side = cluster.dir / "steps"
    side.mkdir(parents=True, exist_ok=True)
    (cluster.dir / "steps_actions.py").write_text(ACTIONS)
    cluster.env["PYTHONPATH"] = str(cluster.dir)
    cluster.env["AWP_STEPS_DIR"] = str(side)
    return side


async def _worker(cluster: Cluster, name: str, concurrency: int = 4) -> WorkerProcess:
    return await cluster.start_foreign_worker(
        name,
        [
            *command("awp-worker"),
            "--server", cluster.server_address,
            "--worker-token", WORKER_TOKEN,
            "--name", name,
            "--kinds", "python",
            "--module", "steps_actions",
            "--concurrency", str(concurrency),
            "--safety-margin", str(cluster.timings.safety_margin_s),
            "--log-format", "json",
        ],
    )  # fmt: skip


def _definition(name: str, action: str, tasks: int, **task_input: object) -> object:
    definition = workload.definition(name, workload.independent(tasks, **task_input))
    for task in definition.tasks:
        task.executor_kind, task.action = "python", action
    return definition


def _executions(side: Path) -> Counter[tuple[str, str]]:
    lines = (side / "executions.log").read_text().splitlines()
    return Counter((task, step) for task, step, _ in (line.split() for line in lines))


async def test_kill_9_after_two_of_three_steps_reruns_only_the_third(cluster: Cluster) -> None:
    side = _setup(cluster)
    await cluster.start_server()
    await cluster.start_coordinator()
    doomed = await _worker(cluster, "doomed")
    tasks = 3
    run_id = await workload.start(
        cluster.control(), _definition("steps-kill", "steps.agent", tasks, hang=True)
    )
    keys = [f"t{i:03d}" for i in range(tasks)]

    def two_done() -> bool:
        return all((side / f"{key}.two-done").exists() for key in keys)

    await wait_for(two_done, "every task past its second step", within=30)
    doomed.process.kill()
    await _worker(cluster, "survivor")
    await wait_run(cluster, run_id, within=60)

    executions = _executions(side)
    assert executions == Counter(
        {(key, step): 1 for key in keys for step in ("plan", "draft", "review")}
    ), "every step ran exactly once across the crash"
    reviews = [line.split() for line in (side / "executions.log").read_text().splitlines()]
    assert {int(attempt) for _, step, attempt in reviews if step == "review"} == {2}
    memos = await cluster.fetch(
        "SELECT name, attempt, count(*) AS n FROM checkpoints WHERE run_id = $1 "
        "GROUP BY name, attempt ORDER BY name",
        run_id,
    )
    assert [tuple(row) for row in memos] == [
        ("draft", 1, tasks),
        ("plan", 1, tasks),
        ("review", 2, tasks),
    ]
    answer = await cluster.control().GetRun(
        runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=ADMIN_AUTH, timeout=10
    )
    for task in answer.tasks:
        assert (task.saved.steps, task.saved.tokens) == (2, 3000), task.key
        assert task.saved.cost_usd == pytest.approx(0.003)
    await cluster.check_invariants({run_id: Expect()})


async def test_a_frozen_attempts_memo_is_refused_after_the_task_ran_elsewhere(
    patient_sessions: Cluster,
) -> None:
    cluster = patient_sessions
    side = _setup(cluster)
    server = await cluster.start_server()
    await cluster.start_coordinator()
    # One slot: frozen holding attempt 1, it has no Claim in flight to take attempt 2.
    frozen = await _worker(cluster, "frozen", concurrency=1)
    run_id = await workload.start(cluster.control(), _definition("steps-stop", "steps.slow", 1))
    await wait_for((side / "inside").exists, "attempt 1 inside its step", within=30)
    await frozen.process.freeze()
    # Its lease runs out on the database clock; the task runs again on another worker.
    await _worker(cluster, "other")
    await wait_run(cluster, run_id, within=60)
    (side / "release").touch()
    frozen.process.thaw()

    await wait_for(
        lambda: frozen.process.count_logged("checkpoints refused") > 0,
        "the thawed worker told its memo was refused",
        within=30,
    )
    assert server.count_logged("step memo refused: lease lost") >= 1
    memos = await cluster.fetch("SELECT name, attempt, value->>'by' AS by FROM checkpoints")
    assert [tuple(row) for row in memos] == [("work", 2, "2")]
    output = await cluster.fetchval("SELECT output->>'by' FROM tasks WHERE run_id = $1", run_id)
    assert output == "2"
    frozen_id = UUID(frozen.worker_id)
    first = await cluster.fetchrow(
        "SELECT state, worker_id FROM attempts WHERE run_id = $1 AND attempt = 1", run_id
    )
    assert first is not None and (first["state"], first["worker_id"]) == ("interrupted", frozen_id)
    await cluster.check_invariants({run_id: Expect()})
