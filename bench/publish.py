"""Writes the benchmark's tables into README.md and docs/performance.md from
bench/results.json, between the markers below, so the figures a reader sees are the
figures of one run, with the machine, the PostgreSQL and the load they were measured
under. `make bench` runs it after bench.py; tests/test_bench_tables.py fails when the
committed documents and results.json disagree.

    .venv/bin/python bench/publish.py            # rewrite both documents
    .venv/bin/python bench/publish.py --check    # exit 1 if they are out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from table_text import DASH, NONE, PG18_SCENARIO, TIMES, Entry, _figure, _find, _num, _table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
BEGIN = "<!-- bench/publish.py: generated from bench/results.json, do not edit by hand -->"
END = "<!-- bench/publish.py: end -->"


def conditions(results: list[Entry]) -> str:
    """One sentence: when, on what, and how loaded the machine was."""
    first = results[0]
    machine = first["machine"]
    when = first.get("measured_at", "date not recorded")
    # A scenario rerun on its own later (bench.py --scenario) says its own conditions.
    same_run = [e for e in results if e.get("measured_at", "date not recorded") == when]
    return (
        f"Measured {when} on {machine['nproc']} {TIMES} {machine['cpu_model']} "
        f"({machine['memory_gb']} GB), {first['postgres']}; {_load(same_run)}."
    )


def _load(entries: list[Entry]) -> str:
    loads = [
        value
        for entry in entries
        for rep in entry.get("loadavg", [])
        for value in (rep["before"][0], rep["after"][0])
    ]
    steal = max((rep["cpu_steal"] for e in entries for rep in e.get("loadavg", [])), default=0)
    load = "load not recorded"
    if loads:
        load = f"1-minute load average {min(loads):.1f}{DASH}{max(loads):.1f}"
    return f"{load}, CPU steal at most {steal:.0%}"


def readme_block(results: list[Entry]) -> list[str]:
    rows = []
    for workers in (1, 4):
        awp = _find(results, "single_run", workers)
        graphile = _find(results, "graphile_worker", workers)
        pgqueuer = _find(results, "pgqueuer", workers)
        rows.append(
            [
                f"{workers} process{'es' if workers > 1 else ''} {TIMES} 8 slots",
                _figure(awp, "tasks_per_s"),
                _figure(graphile, "tasks_per_s"),
                _figure(pgqueuer, "tasks_per_s"),
                _against_faster(awp, [graphile, pgqueuer]),
            ]
        )
    lines = _table(
        ["1,000 no-op tasks, same PostgreSQL, same run", "AWP tasks/s", "Graphile Worker jobs/s",
         "pgqueuer jobs/s", "AWP / faster peer"],
        rows,
    )  # fmt: skip
    many, chain, recovery, latency, peer_latency = (
        _find(results, n)
        for n in ("many_runs", "chain", "recovery", "latency", "graphile_worker_latency")
    )
    sixteen = _find(results, "single_run", 16)
    newer = _find(results, PG18_SCENARIO)
    also = (
        f"Also from that run: 16 workers {_figure(sixteen, 'tasks_per_s', spread=False)}"
        f" tasks/s; 4 {TIMES} 8 on the embedded PostgreSQL 18"
        f" {_figure(newer, 'tasks_per_s', spread=False)} tasks/s; ten concurrent runs"
        f" {_figure(many, 'tasks_per_s', spread=False)} tasks/s"
        f" aggregate (fairness {_figure(many, 'fairness', 2, spread=False)}); chain hop p50"
        f" {_figure(chain, 'hop_ms_p50', 1, spread=False)} ms; single-task latency p50"
        f" {_figure(latency, 'start_latency_ms_p50', 1, spread=False)} ms (Graphile Worker"
        f" {_figure(peer_latency, 'start_latency_ms_p50', 1, spread=False)} ms); all 8 leases"
        " of a `kill -9`ed"
        f" worker re-dispatched in {_figure(recovery, 'redispatch_s', 2, spread=False)} s."
    )
    return [conditions(results), "", *lines, "", also]


def _against_faster(awp: Entry | None, peers: list[Entry | None]) -> str:
    """AWP's median rate over the faster peer's (steady rates), or NONE if either is
    missing."""
    rates = [peer["tasks_per_s"]["median"] for peer in peers if peer and "tasks_per_s" in peer]
    if awp is None or "tasks_per_s" not in awp or not rates:
        return NONE
    return f"{awp['tasks_per_s']['median'] / max(rates):.2f}"


def _cpu(entry: Entry) -> str:
    cpu = entry.get("cpu_s_per_task", {})
    kinds = ("server", "coordinator", "worker", "postgres")
    return " / ".join(f"{cpu[k]['median'] * 1000:.2f}" if k in cpu else NONE for k in kinds)


def performance_block(results: list[Entry]) -> list[str]:
    core = [
        e
        for e in results
        if e["name"] in ("single_run", PG18_SCENARIO, "many_runs", "chain", "recovery")
    ]
    lines = [conditions(results), "", f"Median (min{DASH}max) of the repetitions:", ""]
    lines += _table(
        ["scenario", "workers", f"runs {TIMES} tasks", "tasks/s", "fairness", "hop p50 / p99 ms",
         "re-dispatch s", "xacts/task", "CPU ms/task server / coordinator / worker / PostgreSQL"],
        (
            [e["name"], str(e["workers"]), f"{e['runs']} {TIMES} {e['tasks_per_run']:,}",
             _figure(e, "tasks_per_s"), _figure(e, "fairness", 2),
             _joined(e, "hop_ms_p50", "hop_ms_p99", digits=1),
             _figure(e, "redispatch_s", 2), _figure(e, "db_xacts_per_task", 2), _cpu(e)]
            for e in core
        ),
    )  # fmt: skip
    newer = _find(results, PG18_SCENARIO)
    if newer:
        lines += ["", f"{PG18_SCENARIO}: single_run on {newer['postgres']}, in the same run."]
    peers = [e for e in results if e["name"] == "graphile_worker"]
    if peers:
        lines += ["", "The peer, same PostgreSQL, right after:", ""]
        lines += _table(
            ["peer", f"processes {TIMES} slots", "steady jobs/s", "from spawn jobs/s",
             "AWP / peer"],
            (
                [p["peer"], f"{p['workers']} {TIMES} {p['worker_concurrency']}",
                 _figure(p, "tasks_per_s"), _num(p["jobs_per_s"]["proc"]["median"]),
                 _ratio(results, p)]
                for p in peers
            ),
        )  # fmt: skip
    lines += _pgqueuer_table(results)
    awp, peer = _find(results, "latency"), _find(results, "graphile_worker_latency")
    if awp or peer:
        lines += ["", "Single-task latency, one idle worker, one task after another:", ""]
        lines += _table(
            ["", "from", "p50 ms", "p99 ms"],
            [
                ["AWP", "StartRun called -> attempt started",
                 _figure(awp, "start_latency_ms_p50", 1), _figure(awp, "start_latency_ms_p99", 1)],
                [peer["peer"] if peer else "peer", "addJob called -> job started",
                 _figure(peer, "start_latency_ms_p50", 1),
                 _figure(peer, "start_latency_ms_p99", 1)],
            ],
        )  # fmt: skip
    cancel = _find(results, "cancel_latency")
    if cancel:
        lines += [
            "",
            f"Cancellation latency, one worker at the default 5 s heartbeat, {cancel['runs']}"
            f" cancels a repetition, measured {cancel.get('measured_at', 'on a date not recorded')}"
            f" ({_load([cancel])}; the contract: [design.md](design.md) \u00a77,"
            ' "Cancellation latency"):',
            "",
        ]
        lines += _table(
            ["from", "p50 ms", "p99 ms", "pushed by the server"],
            [["CancelRun called -> the running action's cancellation observed",
              _figure(cancel, "cancel_latency_ms_p50", 1),
              _figure(cancel, "cancel_latency_ms_p99", 1),
              f"{cancel['pushed_share']['median']:.0%}"]],
        )  # fmt: skip
    lines += _streams(results)
    lines += _replay(results)
    lines += _flow(results)
    lines += _waits(results)
    lines += _cost_model(results)
    return lines


def _flow(results: list[Entry]) -> list[str]:
    plain, limited = _find(results, "flow"), _find(results, "flow_limited")
    if not plain or not limited:
        return []
    lines = [
        "",
        f"Flow control (bench/flow_bench.py; the contract: [design.md](design.md) \u00a717),"
        f" measured {limited.get('measured_at', 'on a date not recorded')}"
        f" ({_load([plain, limited])}): {plain['runs']} runs of {plain['tasks_per_run']}"
        f" instant tasks on {plain['workers']} workers, without limits, then with every task"
        f" holding a concurrency key of its run ({limited['runs']} keys, max 2) and charging a"
        " rate limit set far above the load (what checking them costs; neither binds). The"
        " lag: 4 keys of max 1, 25 tasks of 20 ms each, a task's start minus its"
        " predecessor's finish:",
        "",
    ]
    ratio = limited["tasks_per_s"]["median"] / plain["tasks_per_s"]["median"]
    lines += _table(
        ["", "tasks/s (min-max)", "db xacts per task",
         "unit freed -> next task started p50 / p99 ms"],
        [["no limits", _figure(plain, "tasks_per_s", 0), _figure(plain, "db_xacts_per_task", 2),
          NONE],
         [f"{limited['runs']} keys + a rate limit ({ratio:.0%} of no limits)",
          _figure(limited, "tasks_per_s", 0), _figure(limited, "db_xacts_per_task", 2),
          f"{_figure(limited, 'unit_reuse_ms_p50', 0, spread=False)} /"
          f" {_figure(limited, 'unit_reuse_ms_p99', 0, spread=False)}"]],
    )  # fmt: skip
    return lines


def _streams(results: list[Entry]) -> list[str]:
    streams = _find(results, "streams")
    if not streams:
        return []
    lines = [
        "",
        f"Output streams (bench/stream_bench.py; the contract: [design.md](design.md) \u00a715),"
        f" measured {streams.get('measured_at', 'on a date not recorded')} ({_load([streams])}):"
        " one stream of a chunk every 20 ms alone, then"
        f" {streams['runs']} streams at once, each writing 50 chunks/s and read by its own"
        " reader:",
        "",
    ]
    lines += _table(
        ["", "written -> delivered p50 ms", "p99 ms", "chunks stored/s",
         "db xacts per chunk", "WAL bytes per chunk", "every reader got every chunk once"],
        [["one stream", _figure(streams, "stream_ms_p50", 1), _figure(streams, "stream_ms_p99", 1),
          "50", NONE, NONE, NONE],
         [f"{streams['runs']} streams", _figure(streams, "stream_loaded_ms_p50", 0),
          _figure(streams, "stream_loaded_ms_p99", 0), _figure(streams, "stream_chunks_per_s", 0),
          _figure(streams, "stream_xacts_per_chunk", 3),
          _figure(streams, "stream_wal_bytes_per_chunk", 0),
          "yes" if streams["stream_every_reader_whole"]["median"] == 1 else "no"]],
    )  # fmt: skip
    return lines


def _replay(results: list[Entry]) -> list[str]:
    replay = _find(results, "replay")
    if not replay:
        return []
    steps = int(replay["replay_steps"]["median"])
    lines = [
        "",
        f"Step checkpoints (bench/replay_bench.py; the contract: [design.md](design.md) \u00a716),"
        f" measured {replay.get('measured_at', 'on a date not recorded')} ({_load([replay])}):"
        f" {replay['runs']} runs one after another of a task of {steps} memoised steps that"
        " fails after them on attempt 1 and succeeds on attempt 2, one worker; an attempt's"
        " started -> finished on the database clock:",
        "",
    ]
    lines += _table(
        ["attempt", "p50 ms", "p99 ms"],
        [[f"1: runs the {steps} steps, one fenced RecordStep each",
          _figure(replay, "first_run_ms_p50", 0), _figure(replay, "first_run_ms_p99", 0)],
         [f"2: loads the {steps} memos and replays them (no step runs)",
          _figure(replay, "replay_ms_p50", 1), _figure(replay, "replay_ms_p99", 1)]],
    )  # fmt: skip
    return lines


def _waits(results: list[Entry]) -> list[str]:
    waits = _find(results, "waits")
    if not waits:
        return []
    lines = [
        "",
        f"Waits (bench/waits_bench.py; the contract: [design.md](design.md) \u00a716),"
        f" measured {waits.get('measured_at', 'on a date not recorded')} ({_load([waits])}):"
        f" {waits['runs']} runs one after another of a task that sleeps 300 ms as a durable"
        " wait, then waits for a signal, one worker; on the database clock:",
        "",
    ]
    lines += _table(
        ["from -> to", "p50 ms", "p99 ms"],
        [["SendSignal called -> the task's next attempt started",
          _figure(waits, "signal_to_running_ms_p50", 1),
          _figure(waits, "signal_to_running_ms_p99", 1)],
         ["a sleep's due time -> the task's next attempt started (lateness)",
          _figure(waits, "sleep_lateness_ms_p50", 1),
          _figure(waits, "sleep_lateness_ms_p99", 1)]],
    )  # fmt: skip
    waiting = int(waits["waiting_tasks"]["median"])
    lines += [
        "",
        f"The coordinator's mean pass: {_figure(waits, 'pass_ms_idle', 2)} ms idle,"
        f" {_figure(waits, 'pass_ms_10k_waiting', 2)} ms with {waiting:,} tasks waiting"
        " (approval wait tasks with a timeout, all in the due-time index).",
    ]
    return lines


def _pgqueuer_table(results: list[Entry]) -> list[str]:
    """pgqueuer beside AWP: its steady rate against single_run of the same shape, and its
    N jobs enqueued in one batch for waiting workers against AWP's `batch` (N single-task
    runs in one StartRuns), enqueue included on both sides."""
    peers = [e for e in results if e["name"] == "pgqueuer"]
    if not peers:
        return []
    batch = _find(results, "batch")

    def ratio(awp: Entry | None, peer: Entry, figure: float) -> str:
        if awp is None or awp.get("workers") != peer["workers"]:
            return NONE
        return f"{awp['tasks_per_s']['median'] / figure:.2f}"

    return [
        "",
        f"pgqueuer, same PostgreSQL; its {peers[0]['tasks_per_run']:,} jobs enqueued in one "
        "batch for workers already waiting, as AWP's `batch` starts as many single-task runs "
        "in one StartRuns call (enqueue included):",
        "",
        *_table(
            ["peer", f"processes {TIMES} slots", "steady jobs/s", "enqueue included jobs/s",
             "AWP single_run / peer steady", "AWP batch / peer enqueue included"],
            (
                [p["peer"], f"{p['workers']} {TIMES} {p['worker_concurrency']}",
                 _figure(p, "tasks_per_s"), _num(p["jobs_per_s"]["e2e"]["median"]),
                 ratio(_find(results, "single_run", p["workers"]), p,
                       p["tasks_per_s"]["median"]),
                 ratio(batch, p, p["jobs_per_s"]["e2e"]["median"])]
                for p in peers
            ),
        ),
    ]  # fmt: skip


def _ratio(results: list[Entry], peer: Entry) -> str:
    awp = _find(results, "single_run", peer["workers"])
    return f"{awp['vs_graphile_worker']:.2f}" if awp and "vs_graphile_worker" in awp else NONE


def _cost_model(results: list[Entry]) -> list[str]:
    lines: list[str] = []
    sizes = [e for e in results if e["name"] == "run_size"]
    if sizes:
        lines += ["", "Run size (one run, 16 workers):", ""]
        lines += _table(
            ["tasks", "StartRun ms", "tasks/s", "GetRun ms / KB / tasks listed",
             "ListTasks, all pages s", "ListRuns ms", "DB bytes/task", "CPU ms/task",
             "peak RSS MB server / coordinator / worker"],
            (
                [_figure(e, "tasks_in_run"), _figure(e, "start_run_ms"), _figure(e, "tasks_per_s"),
                 _joined(e, "get_run_ms", "get_run_kb", "get_run_tasks"),
                 _figure(e, "list_tasks_s", 1), _figure(e, "list_runs_ms", 1),
                 _figure(e, "db_bytes_per_task"), _cpu(e), _rss(e)]
                for e in sizes
            ),
        )  # fmt: skip
    runs = _find(results, "concurrent_runs")
    if runs:
        lines += ["", f"{runs['runs']:,} runs of {runs['tasks_per_run']} tasks started at once, "
                  f"{runs['workers']} workers:", ""]  # fmt: skip
        lines += _table(
            ["start all s", "tasks/s", "fairness", "run p50 / p99 s", "xacts/task", "CPU ms/task"],
            [[_figure(runs, "start_all_s", 1), _figure(runs, "tasks_per_s"),
              _figure(runs, "fairness", 2),
              _joined(runs, "run_duration_p50_s", "run_duration_p99_s", digits=2),
              _figure(runs, "db_xacts_per_task", 2), _cpu(runs)]],
        )  # fmt: skip
    big = _find(results, "payload")
    if big:
        pairs = big["tasks_per_run"] // 2
        lines += ["", f"{pairs} producers of ~100 KB outputs, each read by one consumer, "
                  f"{big['workers']} workers:", ""]  # fmt: skip
        lines += _table(
            ["tasks/s", "output MB/s", "WAL MB per 1,000 tasks", "CPU ms/task"],
            [[_figure(big, "tasks_per_s"), _figure(big, "output_mb_per_s", 1),
              _figure(big, "wal_mb_per_1000_tasks", 1), _cpu(big)]],
        )  # fmt: skip
    idle = [e for e in results if e["name"] == "idle_sessions"]
    if idle:
        when = idle[0].get("measured_at", "")
        title = f"Idle worker sessions heartbeating on one awp-server (one run each, {when}):"
        lines += ["", title, ""]
        lines += _table(
            ["sessions", "heartbeats/s", "server cores", "server ms/heartbeat",
             "PostgreSQL cores", "PostgreSQL ms/heartbeat", "commits/s", "write xacts/s",
             "row writes/s", "WAL kB/s", "server RSS MB"],
            (
                [f"{e['workers']:,}", _figure(e, "heartbeats_per_s"),
                 _figure(e, "server_cpu_cores", 2), _figure(e, "server_cpu_ms_per_heartbeat", 2),
                 _figure(e, "pg_cpu_cores", 2), _figure(e, "pg_cpu_ms_per_heartbeat", 3),
                 _figure(e, "db_commits_per_s"), _figure(e, "db_write_xacts_per_s"),
                 _figure(e, "db_row_writes_per_s"), _figure(e, "wal_kb_per_s"),
                 _figure(e, "server_peak_rss_mb")]
                for e in idle
            ),
        )  # fmt: skip
    return lines


def _rss(entry: Entry) -> str:
    rss = entry.get("peak_rss_mb", {})
    kinds = ("server", "coordinator", "worker")
    return " / ".join(f"{rss[k]['median']:.0f}" for k in kinds if k in rss)


def _joined(entry: Entry, *names: str, digits: int = 0) -> str:
    return " / ".join(_figure(entry, name, digits) for name in names)


def replace_block(text: str, block: list[str], where: Path) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{where}: the markers {BEGIN!r} ... {END!r} are missing")
    return pattern.sub(lambda _: "\n".join([BEGIN, *block, END]), text, count=1)


DOCUMENTS: dict[Path, Callable[[list[Entry]], list[str]]] = {
    ROOT / "README.md": readme_block,
    ROOT / "docs" / "performance.md": performance_block,
}


def outdated(results: list[Entry]) -> list[Path]:
    """The documents whose generated part differs from what results.json says."""
    stale = []
    for path, render in DOCUMENTS.items():
        text = path.read_text()
        if replace_block(text, render(results), path) != text:
            stale.append(path)
    return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document is stale")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    results: list[Entry] = json.loads(args.results.read_text())
    if args.check:
        stale = outdated(results)
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run bench/publish.py")
        return 1 if stale else 0
    for path, render in DOCUMENTS.items():
        path.write_text(replace_block(path.read_text(), render(results), path))
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
