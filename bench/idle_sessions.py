"""The cost of idle workers (issue 19, cost model (a)): N worker sessions that hold no
lease and only heartbeat, on one awp-server, measured for a fixed window.

    .venv/bin/python bench/idle_sessions.py --sessions 100 --sessions 1000 --sessions 5000

(alone, on Debian's PostgreSQL 15 as bench/bench.py starts it; ``bench.py --scenario
idle_sessions`` runs the same through ``idle_sessions()``). Per N: a fresh database,
awp-server and awp-coordinator with their production defaults and no real worker, and
bench/sim_workers.py opening N sessions in one process. Once all N are heartbeating (the
simulator, the server's open-stream gauge and the database agree) and a settling
interval has passed, one window of ``measure_s``: heartbeats/s the simulator sent; CPU of
awp-server, awp-coordinator, PostgreSQL (all its processes) and the simulator, in cores
and in ms per heartbeat; the database's commits/s (pg_stat_database, reads included),
write transactions/s (transaction ids issued), row writes/s (inserted + updated), WAL
kB/s and the share of its updates of ``workers`` that were HOT; awp-server's peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
from cluster import Cluster
from pg15 import DebianPostgres
from processes import (
    BIN,
    PgProcesses,
    Postgres,
    Proc,
    _cpu_ticks,
    launch_proc,
    scrape,
    wait_for,
)

from awp_db.connect import connect

HERE = Path(__file__).resolve().parent
MEASURE_S = 20.0
OPEN_WITHIN_S = 90.0  # 5,000 sessions open in ~20 s on two loaded cores
# PostgreSQL 15+ holds an idle backend's counters back for up to 10 s (pgstat.c,
# PGSTAT_IDLE_INTERVAL): the window starts once the opening burst's have landed, so
# both ends of it see the same steady lag. Longer than one heartbeat interval (5 s) too,
# so every session has settled on its own phase.
SETTLE_S = 11.0


def _counts(path: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return found


def _check_alive(procs: Sequence[Proc]) -> None:
    for proc in procs:
        code = proc.popen.poll()
        if code is not None:
            tail = proc.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{proc.name} exited with {code}; log tail:\n{tail}")


async def _fresh_counts(path: Path, procs: Sequence[Proc]) -> dict[str, Any]:
    """The simulator's first counts taken after this call."""
    now = time.time()

    async def taken() -> dict[str, Any]:
        _check_alive(procs)
        found = _counts(path)
        return found if found is not None and found["at"] > now else {}

    return await wait_for(taken, "the simulator's counts", within=10)


async def _db(admin: asyncpg.Connection, database: str) -> dict[str, int]:
    # The next transaction id counts write transactions as they commit (reads take none);
    # the LSN counts WAL at once: neither waits for the statistics' publication.
    row = await admin.fetchrow(
        """SELECT xact_commit, tup_inserted + tup_updated AS row_writes,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal,
                  pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid
             FROM pg_stat_database WHERE datname = $1""",
        database,
    )
    assert row is not None
    return {key: int(value) for key, value in row.items()}


async def _hot(cluster: Cluster) -> tuple[int, int]:
    rows = await cluster.query(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'workers'"
    )
    return int(rows[0]["n_tup_upd"]), int(rows[0]["n_tup_hot_upd"])


async def idle_sessions(
    pg: Postgres, sessions: int, logdir: Path, measure_s: float = MEASURE_S
) -> dict[str, Any]:
    """One count's figures (bench/scenarios.py runs one count per case)."""
    cluster = Cluster(pg, f"awp_bench_idle_{sessions}", logdir)
    admin = await connect(pg.dsn, application_name="awp-bench-admin")
    stats = logdir / f"sim-{sessions}.json"
    sim: Proc | None = None
    try:
        await cluster.start(0)
        sim = launch_proc(
            "sim",
            f"sim-{sessions}",
            [str(BIN / "python"), str(HERE / "sim_workers.py"), "--sessions", str(sessions),
             "--server", f"127.0.0.1:{cluster.grpc_port}", "--stats", str(stats)],
            logdir,
        )  # fmt: skip
        procs = [*cluster.procs, sim]

        async def heartbeating() -> bool:
            _check_alive(procs)
            counts = _counts(stats)
            if counts is None or counts["opened"] < sessions:
                return False
            found = await asyncio.to_thread(scrape, cluster.server_metrics)
            if found.get(("awp_heartbeat_streams_open", ()), 0.0) < sessions:
                return False
            rows = await cluster.query(
                "SELECT count(*) AS n FROM workers WHERE state = 'active' AND stream_epoch > 0"
            )
            return int(rows[0]["n"]) >= sessions

        opening = time.monotonic()
        await wait_for(heartbeating, f"{sessions} heartbeating sessions", OPEN_WITHIN_S, 0.25)
        opened_s = time.monotonic() - opening
        await asyncio.sleep(SETTLE_S)
        return await _window(cluster, admin, sim, stats, sessions, measure_s) | {
            "sessions_open_s": opened_s
        }
    finally:
        # The server first: shutting down, it ends the streams without shortening leases
        # one session at a time, as it would for streams that broke.
        await admin.close()
        await cluster.stop()
        if sim is not None:
            sim.popen.kill()
            sim.popen.wait()


async def _window(
    cluster: Cluster,
    admin: asyncpg.Connection,
    sim: Proc,
    stats: Path,
    sessions: int,
    measure_s: float,
) -> dict[str, Any]:
    procs = [*cluster.procs, sim]
    pgp = PgProcesses(cluster.pg.data_dir)
    load0, ticks0 = os.getloadavg(), _cpu_ticks()
    counts0 = await _fresh_counts(stats, procs)
    db0, hot0 = await _db(admin, cluster.database), await _hot(cluster)
    for proc in procs:
        proc.sample()
    pgp.sample()
    cpu0, pg0 = {p.name: p.cpu for p in procs}, dict(pgp.cpu)
    started = time.monotonic()
    await asyncio.sleep(measure_s)  # the window itself, not a wait for an event
    counts1 = await _fresh_counts(stats, procs)
    db1, hot1 = await _db(admin, cluster.database), await _hot(cluster)
    for proc in procs:
        proc.sample()
    pgp.sample()
    elapsed = time.monotonic() - started
    steal1, total1 = _cpu_ticks()
    beats = (counts1["sent"] - counts0["sent"]) / (counts1["at"] - counts0["at"])
    cores = {p.kind: (p.cpu - cpu0[p.name]) / elapsed for p in procs}
    pg_cores = sum(c - pg0.get(pid, 0.0) for pid, c in pgp.cpu.items()) / elapsed
    server = next(p for p in procs if p.kind == "server")
    updates = hot1[0] - hot0[0]
    return {
        "name": "idle_sessions",
        "workers": sessions,  # bench/report.py's key for the count
        "sessions": sessions,
        "heartbeats_per_s": beats,
        "server_cpu_cores": cores["server"],
        "server_cpu_ms_per_heartbeat": cores["server"] / beats * 1000,
        "coordinator_cpu_cores": cores["coordinator"],
        "pg_cpu_cores": pg_cores,
        "pg_cpu_ms_per_heartbeat": pg_cores / beats * 1000,
        "db_commits_per_s": (db1["xact_commit"] - db0["xact_commit"]) / elapsed,
        "db_write_xacts_per_s": (db1["xid"] - db0["xid"]) / elapsed,
        "db_row_writes_per_s": (db1["row_writes"] - db0["row_writes"]) / elapsed,
        "wal_kb_per_s": (db1["wal"] - db0["wal"]) / elapsed / 1024,
        "workers_hot_update_share": (hot1[1] - hot0[1]) / updates if updates else 0.0,
        "sim_cpu_cores": cores["sim"],
        "server_peak_rss_mb": server.peak_rss / 2**20,
        "loadavg_before": list(load0),
        "loadavg_after": list(os.getloadavg()),
        "cpu_steal": (steal1 - ticks0[0]) / max(1, total1 - ticks0[1]),
    }


async def idle_sessions_counts(
    pg: Postgres, counts: Sequence[int], logdir: Path, measure_s: float = MEASURE_S
) -> list[dict[str, Any]]:
    """Each count's figures, one after another, each on a fresh database."""
    results = []
    for sessions in counts:
        directory = logdir / f"idle_sessions-{sessions}"
        directory.mkdir(parents=True, exist_ok=True)
        results.append(await idle_sessions(pg, sessions, directory, measure_s))
    return results


COLUMNS = {
    "sessions": ("sessions", 0), "hb/s": ("heartbeats_per_s", 0),
    "srv cores": ("server_cpu_cores", 3), "srv ms/hb": ("server_cpu_ms_per_heartbeat", 3),
    "PG cores": ("pg_cpu_cores", 3), "PG ms/hb": ("pg_cpu_ms_per_heartbeat", 3),
    "coord cores": ("coordinator_cpu_cores", 3), "commits/s": ("db_commits_per_s", 1),
    "write xacts/s": ("db_write_xacts_per_s", 1), "rows/s": ("db_row_writes_per_s", 0),
    "HOT": ("workers_hot_update_share", 2), "WAL kB/s": ("wal_kb_per_s", 0),
    "sim cores": ("sim_cpu_cores", 3), "srv RSS MB": ("server_peak_rss_mb", 0),
    "open s": ("sessions_open_s", 1),
}  # fmt: skip


def print_table(results: Sequence[dict[str, Any]]) -> None:
    widths = [max(len(title), 7) for title in COLUMNS]
    print("  ".join(title.rjust(w) for title, w in zip(COLUMNS, widths, strict=True)))
    for entry in results:
        cells = [f"{entry[key]:.{digits}f}" for key, digits in COLUMNS.values()]
        print("  ".join(cell.rjust(w) for cell, w in zip(cells, widths, strict=True)))


async def main_async(counts: list[int], measure_s: float) -> int:
    root = Path(tempfile.mkdtemp(prefix="awp-bench-pg-"))
    logdir = HERE / "out" / f"logs-idle-{time.strftime('%Y%m%d-%H%M%S')}"
    pg = DebianPostgres(root)
    print(f"PostgreSQL {pg.version()} in {root}; logs in {logdir}; loadavg {os.getloadavg()}")
    try:
        pg.start()
        results = []
        for sessions in counts:
            started = time.monotonic()
            (entry,) = await idle_sessions_counts(pg, [sessions], logdir, measure_s)
            results.append(entry)
            took = time.monotonic() - started
            load, steal = entry["loadavg_before"][0], entry["cpu_steal"]
            print(f"{sessions} sessions: {took:.0f} s, loadavg {load:.2f}, steal {steal:.1%}")
    finally:
        pg.stop(mode="fast")
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, action="append", required=True, metavar="N")
    parser.add_argument("--measure-s", type=float, default=MEASURE_S)
    args = parser.parse_args()
    return asyncio.run(main_async(args.sessions, args.measure_s))


if __name__ == "__main__":
    sys.exit(main())
