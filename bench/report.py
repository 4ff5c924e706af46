"""The benchmark's figures: aggregated over repetitions, printed as a table, written to
results.json with the machine they were measured on."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import psutil
from cost_model import COST_MODEL
from processes import KINDS, WORKER_CONCURRENCY
from rich.console import Console
from rich.table import Table
from scenarios import SCENARIOS, Case, Sizes

console = Console(width=max(200, Console().width))


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


FIGURES = (
    "tasks_per_s",
    # the batch scenario's StartRuns call (bench/batch_bench.py)
    "enqueue_ms",
    # the tracing scenario's (bench/tracing_bench.py)
    "tasks_per_s_untraced",
    "tracing_drop_pct",
    "tracing_cpu_us_per_task",
    "spans_per_task",
    "fairness",
    "hop_ms_p50",
    "hop_ms_p99",
    "start_latency_ms_p50",
    "start_latency_ms_p99",
    # where single-task latency goes (bench/scenarios.py: latency)
    "latency_to_start_run_ms_p50",
    "latency_to_grant_ms_p50",
    "latency_to_lease_ms_p50",
    "granted_by_claims",
    "cancel_latency_ms_p50",
    "cancel_latency_ms_p99",
    "stream_ms_p50",
    "stream_ms_p99",
    "stream_loaded_ms_p50",
    "stream_loaded_ms_p99",
    "stream_chunks_per_s",
    "stream_xacts_per_chunk",
    "stream_wal_bytes_per_chunk",
    "stream_every_reader_whole",
    "replay_steps",
    "first_run_ms_p50",
    "first_run_ms_p99",
    "replay_ms_p50",
    "replay_ms_p99",
    "unit_reuse_ms_p50",
    "unit_reuse_ms_p99",
    "signal_to_running_ms_p50",
    "signal_to_running_ms_p99",
    "sleep_lateness_ms_p50",
    "sleep_lateness_ms_p99",
    "pass_ms_idle",
    "waiting_tasks",
    "pass_ms_10k_waiting",
    "pushed_share",
    "redispatch_s",
    "run_success_s",
    "empty_claims_per_task",
    "claims_per_task",
    "db_xacts_per_task",
    "coordinator_passes_per_task",
    # the cost model's (bench/cost_model.py)
    "tasks_in_run",
    "start_run_ms",
    "get_run_ms",
    "get_run_kb",
    "get_run_tasks",
    "list_runs_ms",
    "get_run_tasks_omitted",
    "list_tasks_s",
    "db_bytes_per_task",
    "start_all_s",
    "run_duration_p50_s",
    "run_duration_p99_s",
    "output_mb_per_s",
    "wal_mb_per_1000_tasks",
    # idle sessions (bench/idle_sessions.py)
    "heartbeats_per_s",
    "server_cpu_cores",
    "server_cpu_ms_per_heartbeat",
    "coordinator_cpu_cores",
    "pg_cpu_cores",
    "pg_cpu_ms_per_heartbeat",
    "db_commits_per_s",
    "db_write_xacts_per_s",
    "db_row_writes_per_s",
    "workers_hot_update_share",
    "sessions_open_s",
    "wal_kb_per_s",
    "sim_cpu_cores",
    "server_peak_rss_mb",
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
    for group in ("cpu_s_per_task", "cpu_s_per_task_untraced", "peak_rss_mb"):
        if group not in reps[0]:
            continue  # idle sessions run no tasks
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
    extras = ("elapsed_s", "run_finish_s", "hop_ms_max", "cancel_latency_ms_max")
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
        "start p50/p99 ms", "cancel p50/p99 ms",
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
            f"{_fmt(entry, 'start_latency_ms_p50', 1)}/{_fmt(entry, 'start_latency_ms_p99', 1)}",
            f"{_fmt(entry, 'cancel_latency_ms_p50', 1)}/{_fmt(entry, 'cancel_latency_ms_p99', 1)}",
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


def print_cost_table(results: list[dict[str, Any]]) -> None:
    measured = [e for e in results if e["name"] in COST_MODEL]
    if not measured:
        return
    table = Table(title="Cost model (one repetition each)")
    for column in (
        "scenario", "workers", "runs x tasks", "tasks/s", "StartRun ms", "start all s",
        "run p50/p99 s", "fairness", "GetRun ms / KB / tasks", "DB bytes/task",
        "output MB/s", "WAL MB/1k tasks", "CPU ms/task srv/coord/wrk/pg",
        "peak RSS MB srv/coord/wrk",
    ):  # fmt: skip
        table.add_column(column, justify="right" if column != "scenario" else "left")
    for entry in measured:
        cpu = entry["cpu_s_per_task"]
        rss = entry["peak_rss_mb"]
        tasks = entry.get("tasks_in_run", {}).get("median", entry["tasks_per_run"])
        table.add_row(
            entry["name"],
            str(entry["workers"]),
            f"{entry['runs']:,} x {tasks:,.0f}",
            _fmt(entry, "tasks_per_s"),
            _fmt(entry, "start_run_ms"),
            _fmt(entry, "start_all_s", 1),
            f"{_fmt(entry, 'run_duration_p50_s', 2)}/{_fmt(entry, 'run_duration_p99_s', 2)}",
            _fmt(entry, "fairness", 2),
            "/".join(_fmt(entry, k) for k in ("get_run_ms", "get_run_kb", "get_run_tasks")),
            _fmt(entry, "db_bytes_per_task"),
            _fmt(entry, "output_mb_per_s", 1),
            _fmt(entry, "wal_mb_per_1000_tasks", 1),
            "/".join(
                f"{cpu[k]['median'] * 1000:.2f}"
                for k in ("server", "coordinator", "worker", "postgres")
            ),
            "/".join(f"{rss[k]['median']:.0f}" for k in KINDS),
        )
    console.print(table)


def print_idle_table(results: list[dict[str, Any]]) -> None:
    measured = [e for e in results if e["name"] == "idle_sessions"]
    if not measured:
        return
    table = Table(title="Idle worker sessions heartbeating on one server (one repetition each)")
    columns = {
        "sessions": ("workers", 0), "heartbeats/s": ("heartbeats_per_s", 0),
        "server cores": ("server_cpu_cores", 2), "server ms/hb": ("server_cpu_ms_per_heartbeat", 2),
        "PostgreSQL cores": ("pg_cpu_cores", 2), "PG ms/hb": ("pg_cpu_ms_per_heartbeat", 2),
        "commits/s": ("db_commits_per_s", 0), "row writes/s": ("db_row_writes_per_s", 0),
        "WAL kB/s": ("wal_kb_per_s", 0), "simulator cores": ("sim_cpu_cores", 2),
        "server RSS MB": ("server_peak_rss_mb", 0),
    }  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for entry in measured:
        cells = [
            str(entry["workers"]) if name == "workers" else _fmt(entry, name, digits)
            for name, digits in columns.values()
        ]
        table.add_row(*cells)
    console.print(table)


def _peer_for(results: list[dict[str, Any]], entry: dict[str, Any]) -> dict[str, Any] | None:
    """The Graphile Worker figures with as many processes of as many slots as entry's."""
    if entry["name"] != "single_run":
        return None
    for peer in results:
        if peer["name"] == "graphile_worker" and (peer["workers"], peer["worker_concurrency"]) == (
            entry["workers"],
            entry["worker_concurrency"],
        ):
            return peer
    return None


def compare(results: list[dict[str, Any]]) -> None:
    """Adds to each single_run entry its ratio to Graphile Worker of the same shape:
    AWP's median tasks/s over the peer's median steady jobs/s."""
    for entry in results:
        peer = _peer_for(results, entry)
        if peer is not None:
            ratio = entry["tasks_per_s"]["median"] / peer["tasks_per_s"]["median"]
            entry["vs_graphile_worker"] = round(ratio, 3)


def print_comparison(results: list[dict[str, Any]]) -> None:
    compared = [(e, _peer_for(results, e)) for e in results if "vs_graphile_worker" in e]
    if not compared:
        return
    tasks = compared[0][0]["tasks_per_run"]
    table = Table(
        title=f"AWP and Graphile Worker, same PostgreSQL, same run: {tasks:,} no-op tasks"
    )
    for column in (
        "processes x slots", "AWP tasks/s", "Graphile steady jobs/s", "Graphile from spawn",
        "AWP / Graphile steady",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for entry, peer in compared:
        assert peer is not None
        table.add_row(
            f"{entry['workers']} x {entry['worker_concurrency']}",
            _fmt(entry, "tasks_per_s"),
            _fmt(peer, "tasks_per_s"),
            _fmt({"repetitions": peer["repetitions"], **peer["jobs_per_s"]}, "proc"),
            f"{entry['vs_graphile_worker']:.2f}",
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


def _identity(entry: dict[str, Any]) -> tuple[str, int, int, int]:
    """What makes an entry a different case: scenario, workers and the work's shape."""
    return (entry["name"], entry["workers"], entry.get("runs", 1), entry.get("tasks_per_run", 0))


def write_results(path: Path, results: list[dict[str, Any]], replace: bool) -> None:
    merged = results
    if not replace and path.exists():
        fresh = {_identity(e) for e in results}
        kept = [e for e in json.loads(path.read_text()) if _identity(e) not in fresh]
        order = {name: i for i, name in enumerate(SCENARIOS)}
        merged = sorted([*kept, *results], key=lambda e: (order.get(e["name"], 99), _identity(e)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")
