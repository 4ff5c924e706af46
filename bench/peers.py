"""The fastest PostgreSQL job queues a Python user would compare AWP with, measured on the
same PostgreSQL as AWP in the same run: Graphile Worker 0.17.3 (Node.js), driven by
bench/peers/graphile_bench.js (see its header for what it times), and pgqueuer (Python,
asyncpg), driven by bench/peers/pgqueuer_bench.py in a virtualenv of its own (see its
header: N jobs enqueued in one batch for workers already waiting, like AWP's `batch`).

Its figure set per configuration (P processes x C concurrency), in jobs/s over N no-op
jobs, median/min/max of the repetitions:
* steady: first job started -> last job done (processing only, no start-up);
* proc: worker processes spawned -> last job done (includes Node's start-up);
* e2e: first of N one-by-one addJob calls -> last job done.
AWP's tasks/s counts from StartRun (which creates all the run's tasks) to the run's end
with its workers already running: compared with `steady`, Graphile's is the kinder clock.
Its single-job latency (addJob called -> job started, one idle worker woken by its
LISTEN, jobs one after another) is the counterpart of AWP's ``latency`` scenario.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from processes import Postgres

from awp_db.connect import connect

PEERS = Path(__file__).resolve().parent / "peers"
GRAPHILE_VERSION = "0.17.3"
DATABASE = "graphile_bench"
# RESULT graphile-worker procs=1 concurrency=8 n=1000 runs=3 jobs_per_s proc: median=.. | ...
_RESULT = re.compile(r"^RESULT graphile-worker procs=(\d+) concurrency=(\d+) n=(\d+) runs=(\d+)")
_FIGURE = re.compile(r"(\w+): median=([\d.]+) min=([\d.]+) max=([\d.]+)")
# RESULT graphile-worker latency n=50 ms p50=1.92 p99=3.10
_LATENCY = re.compile(r"^RESULT graphile-worker latency n=(\d+) ms p50=([\d.]+) p99=([\d.]+)")


def _install() -> None:
    if shutil.which("npm") is None:
        raise SystemExit("Node.js and npm are needed for the peer figures (or pass --no-peers)")
    if not (PEERS / "node_modules" / "graphile-worker").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PEERS, check=True
        )


def parse(output: str) -> list[dict[str, Any]]:
    """The RESULT lines of graphile_bench.js as results.json entries."""
    entries = []
    for line in output.splitlines():
        latency = _LATENCY.match(line)
        if latency is not None:
            jobs, p50, p99 = int(latency[1]), float(latency[2]), float(latency[3])
            entries.append(
                {
                    "name": "graphile_worker_latency",
                    "peer": f"Graphile Worker {GRAPHILE_VERSION}",
                    "workers": 1,
                    "worker_concurrency": 1,
                    "runs": jobs,
                    "tasks_per_run": 1,
                    "repetitions": 1,
                    "start_latency_ms_p50": {"median": p50, "min": p50, "max": p50},
                    "start_latency_ms_p99": {"median": p99, "min": p99, "max": p99},
                }
            )
            continue
        head = _RESULT.match(line)
        if head is None:
            continue
        procs, concurrency, jobs, runs = (int(g) for g in head.groups())
        figures = {
            name: {"median": float(med), "min": float(low), "max": float(high)}
            for name, med, low, high in _FIGURE.findall(line)
        }
        entries.append(
            {
                "name": "graphile_worker",
                "peer": f"Graphile Worker {GRAPHILE_VERSION}",
                "workers": procs,
                "worker_concurrency": concurrency,
                "runs": 1,
                "tasks_per_run": jobs,
                "repetitions": runs,
                # The one AWP is compared with (see module docstring).
                "tasks_per_s": figures["steady"],
                "jobs_per_s": figures,
            }
        )
    return entries


async def graphile_worker(
    pg: Postgres, configs: list[tuple[int, int]], jobs: int, repetitions: int, latency_jobs: int
) -> list[dict[str, Any]]:
    """Graphile Worker's figures on a fresh database of pg: one entry per configuration,
    and one for its latency."""
    await asyncio.to_thread(_install)
    admin = await connect(pg.dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await admin.close()
    env = {
        "DATABASE_URL": pg.dsn_for(DATABASE),
        "N_JOBS": str(jobs),
        "RUNS": str(repetitions),
        "CONFIGS": " ".join(f"{p}x{c}" for p, c in configs),
        "LATENCY_JOBS": str(latency_jobs),
        "PATH": _path(),
    }
    process = await asyncio.create_subprocess_exec(
        "node", str(PEERS / "graphile_bench.js"), "bench",
        cwd=PEERS, env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"graphile_bench.js exited {process.returncode}")
    return parse(out.decode())


PGQUEUER_VERSION = "1.6.0"
PGQUEUER_DATABASE = "pgqueuer_bench"
# RESULT pgqueuer procs=4 concurrency=8 n=1000 runs=3 jobs_per_s steady: median=.. | e2e: ..
_PGQUEUER = re.compile(r"^RESULT pgqueuer procs=(\d+) concurrency=(\d+) n=(\d+) runs=(\d+)")


def _pgqueuer_python(venv: Path) -> Path:
    """pgqueuer, pinned, in a virtualenv of its own (never in AWP's)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"pgqueuer=={PGQUEUER_VERSION}",
             f"asyncpg=={version('asyncpg')}"],
            check=True,
        )  # fmt: skip
    return python


def parse_pgqueuer(output: str) -> list[dict[str, Any]]:
    """The RESULT lines of pgqueuer_bench.py as results.json entries."""
    entries = []
    for line in output.splitlines():
        head = _PGQUEUER.match(line)
        if head is None:
            continue
        procs, concurrency, jobs, runs = (int(g) for g in head.groups())
        figures = {
            name: {"median": float(med), "min": float(low), "max": float(high)}
            for name, med, low, high in _FIGURE.findall(line)
        }
        entries.append(
            {
                "name": "pgqueuer",
                "peer": f"pgqueuer {PGQUEUER_VERSION}",
                "workers": procs,
                "worker_concurrency": concurrency,
                "runs": 1,
                "tasks_per_run": jobs,
                "repetitions": runs,
                "tasks_per_s": figures["steady"],
                "jobs_per_s": figures,
            }
        )
    return entries


async def pgqueuer(
    pg: Postgres, configs: list[tuple[int, int]], jobs: int, repetitions: int, venv: Path
) -> list[dict[str, Any]]:
    """pgqueuer's figures on a fresh database of pg: one entry per configuration."""
    python = await asyncio.to_thread(_pgqueuer_python, venv)
    admin = await connect(pg.dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {PGQUEUER_DATABASE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {PGQUEUER_DATABASE}")
    finally:
        await admin.close()
    env = {
        "DATABASE_URL": pg.dsn_for(PGQUEUER_DATABASE),
        "N_JOBS": str(jobs),
        "RUNS": str(repetitions),
        "CONFIGS": " ".join(f"{p}x{c}" for p, c in configs),
        "PATH": _path(),
    }
    process = await asyncio.create_subprocess_exec(
        str(python), str(PEERS / "pgqueuer_bench.py"), "bench",
        env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"pgqueuer_bench.py exited {process.returncode}")
    return parse_pgqueuer(out.decode())


def _path() -> str:
    node = shutil.which("node")
    assert node is not None
    return str(Path(node).parent)
