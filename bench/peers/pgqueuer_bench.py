"""pgqueuer, measured like AWP's batch scenario: P worker processes of C concurrency,
already waiting, then N no-op jobs enqueued in one batch (its `enqueue` of lists: one
statement); the clock runs from just before the enqueue to the last job's end.

Run by bench/peers.py in a virtualenv of its own with pgqueuer pinned
(PGQUEUER_VERSION), never in AWP's: `python pgqueuer_bench.py bench` with DATABASE_URL,
N_JOBS, RUNS and CONFIGS ("1x8 4x8") in the environment. Prints, per configuration:

RESULT pgqueuer procs=P concurrency=C n=N runs=R jobs_per_s steady: median=.. | e2e: ..

steady = N / (last end - first start); e2e = N / (last end - enqueue start), enqueue
included. A worker prints its first start, last end and count when told to stop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import time

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

DSN = os.environ["DATABASE_URL"]


async def worker(concurrency: int) -> None:
    connection = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(connection))
    starts: list[float] = []
    ends: list[float] = []

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        starts.append(time.time())
        ends.append(time.time())

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
    print("READY", flush=True)
    await pgq.run(
        batch_size=max(1, concurrency // 2),
        max_concurrent_tasks=concurrency,
        mode=QueueExecutionMode.continuous,
    )
    print(json.dumps({"first": min(starts, default=0), "last": max(ends, default=0),
                      "count": len(starts)}), flush=True)  # fmt: skip
    await connection.close()


async def one_run(procs: int, concurrency: int, jobs: int) -> tuple[float, float]:
    connection = await asyncpg.connect(DSN)
    await connection.execute("DELETE FROM pgqueuer")
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, __file__, "worker", str(concurrency), stdout=asyncio.subprocess.PIPE
        )
        for _ in range(procs)
    ]
    for process in workers:
        assert process.stdout is not None
        assert (await process.stdout.readline()).strip() == b"READY"
    queries = Queries(AsyncpgDriver(connection))
    enqueued = time.time()
    await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    # Polling the peer's table (its API has no wait for an empty queue), for 5 min at most.
    for _ in range(30_000):
        if await connection.fetchval("SELECT count(*) FROM pgqueuer") == 0:
            break
        await asyncio.sleep(0.01)
    reports = []
    for process in workers:
        process.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    await connection.close()
    assert sum(r["count"] for r in reports) == jobs, reports
    first = min(r["first"] for r in reports if r["count"])
    last = max(r["last"] for r in reports)
    return jobs / (last - first), jobs / (last - enqueued)


async def bench() -> None:
    connection = await asyncpg.connect(DSN)
    await Queries(AsyncpgDriver(connection)).install()
    await connection.close()
    jobs, runs = int(os.environ["N_JOBS"]), int(os.environ["RUNS"])
    for config in os.environ["CONFIGS"].split():
        procs, concurrency = (int(part) for part in config.split("x"))
        rates = [await one_run(procs, concurrency, jobs) for _ in range(runs)]
        parts = " | ".join(
            f"{name}: median={statistics.median(v):.1f} min={min(v):.1f} max={max(v):.1f}"
            for name, v in (("steady", [r[0] for r in rates]), ("e2e", [r[1] for r in rates]))
        )
        print(
            f"RESULT pgqueuer procs={procs} concurrency={concurrency} n={jobs} runs={runs} "
            f"jobs_per_s {parts}",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(worker(int(sys.argv[2])))
    else:
        asyncio.run(bench())
