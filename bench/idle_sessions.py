"""The cost of idle workers (issue 19, cost model (a)): N worker sessions that hold no
lease and only heartbeat, on one awp-server, measured for a fixed window.

The sessions come from one lightweight process (``python bench/idle_sessions.py
--simulate N --server ADDR``), not N awp-worker processes: each session Registers as
awp-worker does and keeps the Heartbeat stream open, sending every heartbeat_interval
the server gave it (5 s by default), with no leases, and never claims. Sessions start
spread over one interval, as workers of a fleet would be, so heartbeats arrive evenly.
The simulator prints ``READY`` once all are heartbeating and the heartbeats it has sent
(``SENT n``) every second.

Figures per N (one repetition): heartbeats/s actually sent, CPU of awp-server,
awp-coordinator, PostgreSQL (all its processes) and the simulator, in cores and in ms
per heartbeat; the database's commits/s and row writes/s; WAL kB/s; awp-server's peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
from cluster import Cluster
from processes import BIN, PgProcesses, Postgres, _cpu_ticks, wait_for

from awp.v1 import worker_pb2, worker_pb2_grpc
from awp_db.connect import connect

SESSIONS_PER_CHANNEL = 250  # HTTP/2 streams share a connection; keep them few per socket
MEASURE_S = 20.0


# --- the simulator (a subprocess) ---------------------------------------------------------


async def _session(stub: worker_pb2_grpc.WorkerServiceStub, index: int, sent: list[int]) -> None:
    answer = await stub.Register(
        worker_pb2.RegisterRequest(
            name=f"idle-{index}", protocol_version=1, executor_kinds=["idle"], max_concurrency=1
        ),
        timeout=60,
    )
    interval = answer.heartbeat_interval.ToTimedelta().total_seconds()
    beat = worker_pb2.HeartbeatRequest(session=answer.session)
    queue: asyncio.Queue[worker_pb2.HeartbeatRequest] = asyncio.Queue()

    async def requests() -> Any:
        while True:
            yield await queue.get()

    stream = stub.Heartbeat(requests())
    while True:
        queue.put_nowait(beat)
        await stream.read()
        sent[0] += 1
        await asyncio.sleep(interval)


async def simulate(server: str, sessions: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    count = (sessions + SESSIONS_PER_CHANNEL - 1) // SESSIONS_PER_CHANNEL
    # Separate subchannels, so each channel is its own connection.
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(server, options=options) for _ in range(count)]
    stubs = [worker_pb2_grpc.WorkerServiceStub(c) for c in channels]
    sent = [0]
    spread_s = 5.0 / max(1, sessions)  # one heartbeat interval, the server's default
    tasks = []
    for i in range(sessions):
        tasks.append(asyncio.create_task(_session(stubs[i // SESSIONS_PER_CHANNEL], i, sent)))
        await asyncio.sleep(spread_s)
    while sent[0] < sessions:
        for task in tasks:
            if task.done():
                task.result()  # a session that failed ends the simulation with its error
        await asyncio.sleep(0.05)
    print("READY", flush=True)
    while True:
        await asyncio.sleep(1.0)
        print(f"SENT {sent[0]}", flush=True)


# --- the measurement -----------------------------------------------------------------------


async def _stats(admin: Any, database: str) -> tuple[int, int, int]:
    row = await admin.fetchrow(
        """SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS writes,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal
             FROM pg_stat_database WHERE datname = $1""",
        database,
    )
    return int(row["xact_commit"]), int(row["writes"]), int(row["wal"])


async def idle_sessions(
    pg: Postgres, sessions: int, logdir: Path, measure_s: float = MEASURE_S
) -> dict[str, Any]:
    cluster = Cluster(pg, f"awp_bench_idle_{sessions}", logdir)
    admin = await connect(pg.dsn, application_name="awp-bench-admin")
    sim: subprocess.Popen[str] | None = None
    reader: asyncio.Task[None] | None = None
    try:
        await cluster.start(0)
        with (logdir / f"sim-{sessions}.log").open("w") as log:
            sim = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [str(BIN / "python"), __file__, "--simulate", str(sessions),
                 "--server", f"127.0.0.1:{cluster.grpc_port}"],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
        assert sim.stdout is not None
        ready = await asyncio.wait_for(asyncio.to_thread(sim.stdout.readline), timeout=120)
        if ready.strip() != "READY":
            raise RuntimeError(f"the simulator did not start {sessions} sessions: {ready!r}")

        async def all_active() -> bool:
            rows = await cluster.query("SELECT count(*) AS n FROM workers WHERE state = 'active'")
            return int(rows[0]["n"]) >= sessions

        await wait_for(all_active, f"{sessions} active sessions", within=60)
        pgp = PgProcesses(pg.data_dir)
        sim_ps = psutil.Process(sim.pid)
        counted = Counted(sim)
        reader = asyncio.create_task(asyncio.to_thread(counted.follow))
        watched = [*cluster.procs]
        for proc in watched:
            proc.sample()
        pgp.sample()
        cpu0 = {p.name: p.cpu for p in watched}
        pg0 = sum(pgp.cpu.values())
        sim0 = sum(sim_ps.cpu_times()[:2])
        sent0 = await counted.next()
        stats0 = await _stats(admin, cluster.database)
        load0 = os.getloadavg()
        ticks0 = _cpu_ticks()
        started = time.monotonic()
        await asyncio.sleep(measure_s)  # the measured window itself, not a wait for an event
        sent1 = await counted.next()
        elapsed = time.monotonic() - started
        await asyncio.sleep(1.2)  # backends publish their counters at most once a second
        stats1 = await _stats(admin, cluster.database)
        for proc in watched:
            proc.sample()
        pgp.sample()
        beats = (sent1 - sent0) / elapsed
        cores = {p.name: (p.cpu - cpu0[p.name]) / elapsed for p in watched}
        pg_cores = (sum(pgp.cpu.values()) - pg0) / elapsed
        server = next(p for p in watched if p.kind == "server")
        return {
            "loadavg_before": list(load0),
            "loadavg_after": list(os.getloadavg()),
            "cpu_steal": _steal_since(ticks0),
            "name": "idle_sessions",
            "workers": sessions,
            "sessions": sessions,
            "heartbeats_per_s": beats,
            "server_cpu_cores": cores["server"],
            "server_cpu_ms_per_heartbeat": cores["server"] / beats * 1000,
            "coordinator_cpu_cores": cores["coordinator"],
            "pg_cpu_cores": pg_cores,
            "pg_cpu_ms_per_heartbeat": pg_cores / beats * 1000,
            "db_commits_per_s": (stats1[0] - stats0[0]) / elapsed,
            "db_row_writes_per_s": (stats1[1] - stats0[1]) / elapsed,
            "wal_kb_per_s": (stats1[2] - stats0[2]) / elapsed / 1024,
            "sim_cpu_cores": (sum(sim_ps.cpu_times()[:2]) - sim0) / elapsed,
            "server_peak_rss_mb": server.peak_rss / 2**20,
        }
    finally:
        if sim is not None:
            sim.kill()
            sim.wait()
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader
        await admin.close()
        await cluster.stop()


def _steal_since(ticks0: tuple[int, int]) -> float:
    steal1, total1 = _cpu_ticks()
    return (steal1 - ticks0[0]) / max(1, total1 - ticks0[1])


class Counted:
    """The simulator's count of heartbeats sent, followed line by line in a thread (the
    pipe would otherwise hand back stale lines)."""

    def __init__(self, sim: subprocess.Popen[str]) -> None:
        self.sim = sim
        self.sent = -1
        self.lines = 0
        self.ended = ""

    def follow(self) -> None:
        assert self.sim.stdout is not None
        for line in self.sim.stdout:
            if line.startswith("SENT "):
                self.sent = int(line.split()[1])
                self.lines += 1
        self.ended = "the simulator exited"

    async def next(self) -> int:
        """The first count printed after this call."""
        seen = self.lines

        async def printed() -> int | None:
            if self.ended:
                raise RuntimeError(self.ended)
            return self.sent if self.lines > seen else None

        return await wait_for(printed, "the simulator's next count", within=10, every=0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", type=int, required=True, metavar="N")
    parser.add_argument("--server", required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(simulate(args.server, args.simulate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
