"""Schedules (docs/schedules.md): how late ticks fire, and what 10,000 schedules cost the
coordinator.

    .venv/bin/python bench/schedules.py            # writes its entry of bench/results.json

On Debian's PostgreSQL 15 as bench/bench.py starts it, a fresh database, awp-server and
awp-coordinator with their production defaults (scan interval 1 s), no worker (a run's
creation is what a tick does; executing it is the other benchmarks' subject).

* ``lateness``: 20 schedules every second (overlap allow_all) for ``--window-s``; per
  tick, the run's ``created_at`` minus the tick's instant, both on the database clock:
  p50, p99, max.
* ``idle``: the coordinator's CPU (cores) over ``--window-s`` with no schedule, then with
  10,000 live schedules none of which is due in the window (daily at midnight UTC): what
  holding schedules costs between ticks; and the pass's ``due`` read with them (ms,
  EXPLAIN ANALYZE, the median of 20).
* ``burst``: the 10,000 made every-minute schedules and resumed at once, so all tick at
  the same minute: seconds from that tick until its last run exists, ticks/s, and the
  lateness p50/p99 within the burst.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import Cluster
from google.protobuf import duration_pb2
from pg15 import DebianPostgres
from processes import Proc

from awp.v1 import control_pb2, schedule_pb2, types_pb2
from awp_db.queries import queries

HERE = Path(__file__).resolve().parent
SCHEDULES = 10_000
EVERY_SECOND = 20
WINDOW_S = 30.0

LATENESS = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY l) AS p99, max(l) AS max, count(*) AS n
  FROM (SELECT extract(epoch FROM r.created_at - r.schedule_tick) * 1000 AS l
          FROM runs r JOIN schedules s ON s.id = r.schedule_id
         WHERE s.name LIKE $1 AND r.schedule_tick >= $2) x
"""


def _coordinator(cluster: Cluster) -> Proc:
    return next(p for p in cluster.procs if p.kind == "coordinator")


async def _cpu_cores(cluster: Cluster, seconds: float) -> float:
    proc = _coordinator(cluster)
    proc.sample()
    before, started = proc.cpu, time.monotonic()
    await asyncio.sleep(seconds)
    proc.sample()
    return (proc.cpu - before) / (time.monotonic() - started)


async def _workflow(cluster: Cluster) -> None:
    assert cluster.control is not None
    await cluster.control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(
            definition=types_pb2.WorkflowDefinition(
                name="tick",
                version=1,
                tasks=[types_pb2.TaskDefinition(key="a", executor_kind="mock", action="noop")],
            )
        ),
        timeout=10,
    )


async def lateness(cluster: Cluster, window_s: float) -> dict[str, Any]:
    assert cluster.control is not None
    for i in range(EVERY_SECOND):
        await cluster.control.CreateSchedule(
            schedule_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.ScheduleSpec(
                    name=f"second-{i:02d}",
                    workflow_name="tick",
                    interval=duration_pb2.Duration(seconds=1),
                    overlap=schedule_pb2.OVERLAP_POLICY_ALLOW_ALL,
                )
            ),
            timeout=10,
        )
    (row,) = await cluster.query("SELECT clock_timestamp() AS now")
    await asyncio.sleep(window_s)
    (found,) = await cluster.query(LATENESS, "second-%", row["now"])
    await cluster.query("UPDATE schedules SET paused = true WHERE name LIKE 'second-%'")
    return {
        "ticks": int(found["n"]),
        "lateness_p50_ms": round(float(found["p50"]), 1),
        "lateness_p99_ms": round(float(found["p99"]), 1),
        "lateness_max_ms": round(float(found["max"]), 1),
    }


async def idle_and_burst(cluster: Cluster, window_s: float) -> dict[str, Any]:
    without = await _cpu_cores(cluster, window_s)
    # Made in SQL, all at once: the API's checks are not the subject here.
    await cluster.query(
        """INSERT INTO schedules (name, workflow_name, input, interval_ms, overlap, catchup,
                                  catchup_window_ms, next_tick_at, created_by, updated_by)
           SELECT 'many-' || i, 'tick', '{}', 86400000, 'skip', 'all', 60000,
                  date_trunc('day', clock_timestamp()) + interval '1 day', 'bench', 'bench'
             FROM generate_series(1, $1) AS i""",
        SCHEDULES,
    )
    await cluster.query("ANALYZE schedules")
    holding = await _cpu_cores(cluster, window_s)
    due_sql = queries("coordination")["due"]
    timings = []
    for _ in range(20):
        plan = await cluster.query("EXPLAIN (ANALYZE, FORMAT JSON) " + due_sql, 3, 15000, 0.5)
        found = plan[0][0]  # json, decoded by the connection's codec or not
        timings.append(
            (json.loads(found) if isinstance(found, str) else found)[0]["Execution Time"]
        )

    idle = {
        "coordinator_cores_no_schedules": round(without, 4),
        "coordinator_cores_10000_schedules": round(holding, 4),
        "due_read_ms_10000_schedules": round(statistics.median(timings), 2),
    }
    print(f"idle: {idle}", flush=True)

    # Every schedule ticks at the next whole minute.
    (row,) = await cluster.query(
        "SELECT date_trunc('minute', clock_timestamp()) + interval '1 minute' AS tick"
    )
    tick = row["tick"]
    await cluster.query(
        "UPDATE schedules SET interval_ms = 60000, next_tick_at = $1 WHERE name LIKE 'many-%'",
        tick,
    )
    await cluster.query("NOTIFY awp_coordinator, 'bench'")

    async def all_fired() -> bool:
        (count,) = await cluster.query(
            "SELECT count(*) AS n FROM runs WHERE schedule_tick = $1", tick
        )
        return int(count["n"]) >= SCHEDULES

    deadline = time.monotonic() + 60 + 300
    while not await all_fired():
        if time.monotonic() > deadline:
            raise RuntimeError("the burst did not fire within 5 minutes")
        await asyncio.sleep(0.5)
    (found,) = await cluster.query(LATENESS, "many-%", tick)
    (last,) = await cluster.query(
        """SELECT extract(epoch FROM max(created_at) - $1) AS s FROM runs
            WHERE schedule_tick = $1""",
        tick,
    )
    await cluster.query("UPDATE schedules SET paused = true WHERE name LIKE 'many-%'")
    return idle | {
        "burst_ticks": SCHEDULES,
        "burst_s": round(float(last["s"]), 2),
        "burst_ticks_per_s": round(SCHEDULES / float(last["s"]), 1),
        "burst_lateness_p50_ms": round(float(found["p50"]), 1),
        "burst_lateness_p99_ms": round(float(found["p99"]), 1),
    }


async def main_async(window_s: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="awp-bench-pg-"))
    logdir = HERE / "out" / f"logs-schedules-{time.strftime('%Y%m%d-%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    pg = DebianPostgres(root)
    print(f"PostgreSQL {pg.version()} in {root}; logs in {logdir}; loadavg {os.getloadavg()}")
    pg.start()
    cluster = Cluster(pg, "awp_bench_schedules", logdir)
    try:
        await cluster.start(0)
        await _workflow(cluster)
        figures = await lateness(cluster, window_s)
        print(f"lateness: {figures}", flush=True)
        figures |= await idle_and_burst(cluster, window_s)
    finally:
        await cluster.stop()
        pg.stop(mode="fast")
        shutil.rmtree(root, ignore_errors=True)
    return figures | {"loadavg_at_end": list(os.getloadavg()), "window_s": window_s}


def record(figures: dict[str, Any], path: Path = HERE / "results.json") -> None:
    """Replaces the `schedules` entry of results.json (the file bench.py writes)."""
    results = json.loads(path.read_text()) if path.exists() else []
    entries = results if isinstance(results, list) else results.setdefault("scenarios", [])
    entries[:] = [e for e in entries if e.get("name") != "schedules"]
    entries.append({"name": "schedules", "workers": 0, **figures})
    path.write_text(json.dumps(results, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-s", type=float, default=WINDOW_S)
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args()
    figures = asyncio.run(main_async(args.window_s))
    for key, value in figures.items():
        print(f"{key}: {value}")
    if not args.no_record:
        record(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
