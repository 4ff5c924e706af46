"""The benchmark's workflows and scenarios, and the cases that run them: which scenario,
how many workers, profiled or not."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import flow_bench
import stream_bench
from batch_bench import batch_enqueue
from cancel_latency import cancel_latency
from cluster import Cluster, Window
from cost_model import COST_MODEL, concurrent_runs, payload, run_size
from idle_sessions import idle_sessions
from processes import BIN, WORKER_CONCURRENCY, PgProcesses, Postgres, percentile, wait_for
from replay_bench import replay
from table_text import PG18_SCENARIO
from tracing_bench import tracing_overhead
from waits_bench import waits

from awp.v1 import control_pb2, runs_pb2, types_pb2
from awp_db.connect import connect

SCENARIOS = (
    "single_run",
    # single_run 4 x 8 once more, on the embedded PostgreSQL 18 (bench.py starts it).
    PG18_SCENARIO,
    # single_run/4w untraced and traced, exported (bench/tracing_bench.py).
    "tracing",
    "many_runs",
    # 1,000 single-task runs in one StartRuns call (bench/batch_bench.py).
    "batch",
    "chain",
    "latency",
    "recovery",
    "cancel_latency",
    "streams",
    "replay",
    "flow",
    "flow_limited",
    "waits",
    *COST_MODEL,
    "idle_sessions",
)


# --- workflows -----------------------------------------------------------------------------


def definition(
    name: str,
    tasks: int,
    *,
    chain: bool = False,
    task_input: dict[str, Any] | None = None,
    timeout_ms: int | None = None,
    initial_backoff_ms: int | None = None,
) -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name=name, version=1)
    for i in range(tasks):
        task = wf.tasks.add(key=f"t{i:05d}", executor_kind="mock", action="noop")
        if chain and i:
            task.depends_on.append(f"t{i - 1:05d}")
        if task_input:
            task.input.update(task_input)
        if timeout_ms is not None:
            task.timeout.FromMilliseconds(timeout_ms)
        if initial_backoff_ms is not None:
            task.retry.max_attempts = 3
            task.retry.initial_backoff.FromMilliseconds(initial_backoff_ms)
            task.retry.max_backoff.FromMilliseconds(max(initial_backoff_ms, 1000))
            task.retry.backoff_multiplier = 2.0
    return wf


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


# --- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    single_tasks: int = 1000
    single_workers: tuple[int, ...] = (1, 4, 16)
    many_runs: int = 10
    many_tasks: int = 1000
    chain_tasks: int = 200
    latency_runs: int = 50
    cancels: int = 200
    recovery_sleep_ms: int = 20_000
    run_sizes: tuple[int, ...] = (10_000, 100_000)
    concurrent_runs: int = 1000
    concurrent_tasks: int = 10
    payload_pairs: int = 500
    idle_sessions: tuple[int, ...] = (100, 1000, 5000)
    replay_runs: int = 20
    waits_runs: int = 20

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            single_tasks=300,
            many_runs=4,
            many_tasks=250,
            chain_tasks=50,
            latency_runs=10,
            cancels=20,
            recovery_sleep_ms=6_000,
            run_sizes=(1_000, 12_000),  # the second one fans out through map tasks
            concurrent_runs=100,
            payload_pairs=50,
            idle_sessions=(50, 300),
            replay_runs=5,
            waits_runs=5,
        )


async def single_run(
    cluster: Cluster, window: Window, sizes: Sizes, runs: int, tasks: int
) -> dict[str, Any]:
    wf = definition("bench", tasks)
    await window.start()
    run_ids = await cluster.start_runs(wf, runs)
    rows = await cluster.wait_runs(run_ids)
    figures = await window.stop(runs * tasks)
    t0 = min(row["created_at"] for row in rows)
    ends = [_seconds(t0, row["finished_at"]) for row in rows]
    figures["tasks_per_s"] = runs * tasks / max(ends)
    figures["elapsed_s"] = max(ends)
    if runs > 1:
        figures["fairness"] = max(ends) / statistics.median(ends)
        figures["run_finish_s"] = sorted(ends)
    return figures


async def chain(cluster: Cluster, window: Window, sizes: Sizes) -> dict[str, Any]:
    n = sizes.chain_tasks
    await window.start()
    (run_id,) = await cluster.start_runs(definition("chain", n, chain=True), 1)
    rows = await cluster.wait_runs([run_id])
    figures = await window.stop(n)
    attempts = await cluster.query(
        """SELECT t.key, a.started_at, a.finished_at
             FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE a.run_id = $1 AND a.state = 'succeeded'
            ORDER BY t.key""",
        run_id,
    )
    hops = [
        _seconds(prev["finished_at"], nxt["started_at"]) * 1000
        for prev, nxt in itertools.pairwise(attempts)
    ]
    figures["hop_ms_p50"] = percentile(hops, 50)
    figures["hop_ms_p99"] = percentile(hops, 99)
    figures["hop_ms_max"] = max(hops)
    figures["tasks_per_s"] = n / _seconds(rows[0]["created_at"], rows[0]["finished_at"])
    return figures


async def latency(cluster: Cluster, window: Window, runs: int) -> dict[str, Any]:
    """Single-task latency: runs of one task started one after another, each once the
    previous has finished (the worker idle, its Claim parked). A sample runs from just
    before the StartRun call (the client's clock) to the attempt's started_at (the
    database's: the same machine's clock)."""
    assert cluster.control is not None
    wf = definition("latency", 1)
    await cluster.control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    await window.start()
    samples = []
    parts: dict[str, list[float]] = {"to_start_run": [], "to_grant": [], "to_lease": []}
    by_claim = 0
    for i in range(runs):
        started = time.time()
        answer = await cluster.control.StartRun(
            runs_pb2.StartRunRequest(workflow_name=wf.name, request_id=f"latency-{i}")
        )
        run_id = UUID(answer.run.id)
        await cluster.wait_runs([run_id], within=30)
        rows = await cluster.query(LATENCY_PARTS, run_id)
        row = rows[0]
        samples.append((row["started_at"].timestamp() - started) * 1000)
        # Where the time went: to StartRun's transaction, from it to the transaction
        # that granted the task (a Claim's, or the coordinator's pass, which records its
        # epoch), and in that transaction until the attempt started.
        parts["to_start_run"].append((row["created_at"].timestamp() - started) * 1000)
        parts["to_grant"].append((row["granting_at"] - row["created_at"]).total_seconds() * 1000)
        parts["to_lease"].append((row["started_at"] - row["granting_at"]).total_seconds() * 1000)
        by_claim += row["by_claim"]
    figures = await window.stop(runs)
    figures["start_latency_ms_p50"] = percentile(samples, 50)
    figures["start_latency_ms_p99"] = percentile(samples, 99)
    for name, values in parts.items():
        figures[f"latency_{name}_ms_p50"] = percentile(values, 50)
    figures["granted_by_claims"] = by_claim / runs
    return figures


LATENCY_PARTS = """
SELECT r.created_at, e.created_at AS granting_at, a.started_at,
       (e.payload ? 'leader_epoch') IS FALSE AS by_claim
  FROM runs r JOIN attempts a ON a.run_id = r.id
  JOIN state_events e ON e.run_id = r.id AND e.from_state = 'ready' AND e.to_state = 'queued'
 WHERE r.id = $1"""


async def recovery(cluster: Cluster, window: Window, sizes: Sizes) -> dict[str, Any]:
    victim = cluster.workers()[0]
    wf = definition(
        "recovery",
        WORKER_CONCURRENCY,
        task_input={"sleep_ms": sizes.recovery_sleep_ms},
        timeout_ms=sizes.recovery_sleep_ms * 3,
        initial_backoff_ms=0,
    )
    await window.start()
    (run_id,) = await cluster.start_runs(wf, 1)

    async def all_running_on_victim() -> bool:
        rows = await cluster.query(
            """SELECT count(*) AS n FROM attempts a JOIN workers w ON w.id = a.worker_id
                WHERE a.run_id = $1 AND a.state = 'running' AND w.name = $2""",
            run_id,
            "bench-worker-1",
        )
        return int(rows[0]["n"]) == WORKER_CONCURRENCY

    await wait_for(all_running_on_victim, "the first worker to hold all 8 leases", within=30)
    await cluster.add_workers(1)
    await asyncio.sleep(0.5)  # let it park its first Claim
    victim.sample()
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    victim.popen.wait()

    async def all_restarted() -> list[asyncpg.Record] | None:
        rows = await cluster.query(
            """SELECT a.started_at, w.name FROM attempts a JOIN workers w ON w.id = a.worker_id
                WHERE a.run_id = $1 AND a.attempt = 2""",
            run_id,
        )
        return rows if len(rows) == WORKER_CONCURRENCY else None

    restarted = await wait_for(all_restarted, "attempt 2 of all 8 tasks", within=60, every=0.02)
    rows = await cluster.wait_runs([run_id], within=sizes.recovery_sleep_ms / 1000 * 4 + 60)
    figures = await window.stop(WORKER_CONCURRENCY)
    wrong = [row["name"] for row in restarted if row["name"] != "bench-worker-2"]
    if wrong:
        raise RuntimeError(f"attempt 2 ran on {wrong}, expected the second worker")
    figures["redispatch_s"] = max(row["started_at"].timestamp() for row in restarted) - killed_at
    figures["run_success_s"] = rows[0]["finished_at"].timestamp() - killed_at
    figures["task_sleep_s"] = sizes.recovery_sleep_ms / 1000
    return figures


# --- driver ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    workers: int
    tasks: int
    runs: int = 1
    # The cost model's scenarios are long and measure growth, not noise: once.
    once: bool = False

    @property
    def label(self) -> str:
        size = f"/{self.runs}x{self.tasks}" if self.name in COST_MODEL else ""
        return f"{self.name}/{self.workers}w{size}"


def cases(selected: Iterable[str], sizes: Sizes) -> list[Case]:
    chosen = []
    for name in selected:
        if name == "single_run":
            chosen += [Case(name, w, sizes.single_tasks) for w in sizes.single_workers]
        elif name in (PG18_SCENARIO, "tracing"):
            chosen.append(Case(name, 4, sizes.single_tasks))
        elif name == "many_runs":
            chosen.append(Case(name, 4, sizes.many_tasks, sizes.many_runs))
        elif name == "chain":
            chosen.append(Case(name, 4, sizes.chain_tasks))
        elif name == "batch":
            chosen.append(Case(name, 4, 1, sizes.single_tasks))
        elif name == "latency":
            chosen.append(Case(name, 1, 1, sizes.latency_runs))
        elif name == "cancel_latency":
            chosen.append(Case(name, 1, 1, sizes.cancels))
        elif name in ("flow", "flow_limited"):
            # 100 runs of 10: with limits, 100 keys (docs/performance.md, "Flow control").
            chosen.append(Case(name, 4, 10, 100))
        elif name == "streams":
            # 13 workers of 8 slots: room for the 100 streams at once.
            chosen.append(Case(name, 13, 1, stream_bench.STREAMS, once=True))
        elif name == "replay":
            chosen.append(Case(name, 1, 1, sizes.replay_runs))
        elif name == "waits":
            chosen.append(Case(name, 1, 1, sizes.waits_runs))
        elif name == "recovery":
            # One worker holds the leases and is killed; a second one starts to take over.
            chosen.append(Case(name, 2, WORKER_CONCURRENCY))
        elif name == "run_size":
            chosen += [Case(name, 16, tasks, once=True) for tasks in sizes.run_sizes]
        elif name == "concurrent_runs":
            chosen.append(Case(name, 4, sizes.concurrent_tasks, sizes.concurrent_runs, once=True))
        elif name == "payload":
            chosen.append(Case(name, 4, 2 * sizes.payload_pairs, once=True))
        elif name == "idle_sessions":
            # "workers": simulated sessions, which hold no lease and only heartbeat.
            chosen += [Case(name, n, 0, once=True) for n in sizes.idle_sessions]
    return chosen


async def profile_start(
    cluster: Cluster, directory: Path, label: str
) -> list[subprocess.Popen[bytes]]:
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    spies = []
    for proc in cluster.procs:
        if proc.popen.poll() is not None:
            continue
        out = directory / f"{label.replace('/', '-')}-{proc.name}.txt"
        spies.append(
            subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [str(BIN / "py-spy"), "record", "--pid", str(proc.pid), "--rate", "100",
                 "--format", "raw", "--output", str(out), "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
    await asyncio.sleep(1.0)  # attaching takes a moment
    return spies


def profile_stop(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()


async def run_case(
    pg: Postgres,
    case: Case,
    repetition: int,
    sizes: Sizes,
    logdir: Path,
    spy_dir: Path | None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    database = f"awp_bench_{case.name}_{case.workers}_{case.runs}_{case.tasks}_{repetition}"
    caselogs = logdir / f"{case.label.replace('/', '-')}-{repetition}"
    caselogs.mkdir(parents=True, exist_ok=True)
    if case.name == "idle_sessions":
        return await idle_sessions(pg, case.workers, caselogs)
    if case.name == "tracing":
        return await tracing_overhead(
            pg,
            case.workers,
            case.tasks,
            repetition,
            caselogs,
            lambda cluster, window: single_run(cluster, window, sizes, 1, case.tasks),
        )
    caselogs.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(pg, database, caselogs, env)
    admin = await connect(pg.dsn, application_name="awp-bench-admin")
    spies: list[subprocess.Popen[bytes]] = []
    try:
        # The cancellation scenario reads when an action starts from the worker's debug log.
        await cluster.start(
            case.workers - 1 if case.name == "recovery" else case.workers,
            worker_args=("--log-level", "debug") if case.name == "cancel_latency" else (),
        )
        window = Window(cluster, PgProcesses(pg.data_dir), admin)
        if spy_dir is not None:
            spies = await profile_start(cluster, spy_dir, f"{case.label}-{repetition}")
        if case.name in ("single_run", PG18_SCENARIO, "many_runs"):
            figures = await single_run(cluster, window, sizes, case.runs, case.tasks)
        elif case.name == "chain":
            figures = await chain(cluster, window, sizes)
        elif case.name == "batch":
            figures = await batch_enqueue(cluster, window, case.runs)
        elif case.name == "latency":
            figures = await latency(cluster, window, case.runs)
        elif case.name == "recovery":
            figures = await recovery(cluster, window, sizes)
        elif case.name == "cancel_latency":
            figures = await cancel_latency(cluster, window, case.runs)
        elif case.name == "streams":
            figures = await stream_bench.stream_latency(cluster, window, case.runs)
        elif case.name == "replay":
            figures = await replay(cluster, window, case.runs)
        elif case.name in ("flow", "flow_limited"):
            limited = case.name == "flow_limited"
            figures = await flow_bench.flow(cluster, window, case.runs, case.tasks, limited=limited)
        elif case.name == "waits":
            figures = await waits(cluster, window, case.runs)
        elif case.name == "run_size":
            figures = await run_size(cluster, window, case.tasks)
        elif case.name == "concurrent_runs":
            figures = await concurrent_runs(cluster, window, case.runs, case.tasks)
        else:
            figures = await payload(cluster, window, case.tasks // 2)
        profile_stop(spies)
        spies = []
        return figures
    finally:
        profile_stop(spies)
        await admin.close()
        await cluster.stop()
