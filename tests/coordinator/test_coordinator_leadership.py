"""Leadership and the process loop: one leader per database, standbys take over, a lost
lock stops the leader at once, wake-ups at the next deadline; the real binary under
kill -9 and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from coordinator_support import Coordinator, coordinator

from awp_db import claims, coordination, leases, workers
from awp_db.connect import Pool
from kit import poll_until, spec, start_run
from kit.db import register

ROOT = Path(__file__).resolve().parents[2]


async def _leader_backend(pool: Pool) -> coordination.Leader | None:
    async with pool.acquire() as conn:
        return await coordination.leader(conn)


async def test_one_leads_and_a_standby_takes_over_when_the_lock_connection_dies(
    pool: Pool, database_dsn: str
) -> None:
    first = coordinator(pool, database_dsn, scan_interval_s=0.2, instance="first")
    second = coordinator(pool, database_dsn, scan_interval_s=0.2, instance="second")
    stops = [asyncio.Event(), asyncio.Event()]
    loops = [
        asyncio.create_task(first.run(stops[0])),
        asyncio.create_task(second.run(stops[1])),
    ]
    try:

        async def one_leader() -> Coordinator | None:
            leading = [c for c in (first, second) if c.leading]
            return leading[0] if len(leading) == 1 else None

        leader = await poll_until(one_leader)
        backend = await poll_until(lambda: _leader_backend(pool))
        assert backend.application_name == f"awp-coordinator-lock {leader.config.instance}"

        # The lock's connection dies: the leader stops acting at once (it may win the
        # lock back on a new connection right after: it contends again like the standby).
        await pool.execute("SELECT pg_terminate_backend($1)", backend.pid)

        async def stepped_down() -> bool:
            released = leader.metrics.registry.get_sample_value(
                "awp_coordinator_leadership_changes_total", {"change": "released"}
            )
            return bool(released)

        await poll_until(stepped_down, within=5)

        async def new_leader() -> tuple[int, str] | None:
            now = await _leader_backend(pool)
            return now if now is not None and now.pid != backend.pid else None

        await poll_until(new_leader)
        await poll_until(one_leader)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), 20)
    # A clean stop gives the lock back.
    assert await _leader_backend(pool) is None
    assert not first.leading and not second.leading


async def test_the_leader_wakes_at_the_next_lease_expiry_not_the_next_scan(
    pool: Pool, database_dsn: str
) -> None:
    worker = await register(pool)
    # A scan so long that only notifications and deadlines can drive the passes.
    coord = coordinator(pool, database_dsn, scan_interval_s=60.0)
    stop = asyncio.Event()
    loop = asyncio.create_task(coord.run(stop))
    try:
        await poll_until(lambda: _leader_backend(pool))
        await start_run(pool, spec("woken", 1, backoff_ms=60_000))  # NOTIFY: dispatched

        async def claimed() -> list[claims.IssuedLease]:
            return await worker.claim(ttl_ms=60_000)

        (lease,) = await poll_until(claimed)
        # The worker's stream breaks: its lease now expires after a short grace and the
        # coordinator is told, so it sleeps only until that expiry.
        async with pool.acquire() as conn:
            epoch = await workers.open_stream(conn, worker.id)
            assert epoch is not None
            assert await leases.stream_lost(conn, worker.id, epoch, grace_ms=300) == 1

        async def interrupted() -> bool:
            state = await pool.fetchval(
                "SELECT state FROM attempts WHERE dispatch_id = $1", lease.dispatch_id
            )
            return bool(state == "interrupted")

        # Generous, yet far below the 60 s scan: only the deadline wake-up can do it.
        await poll_until(interrupted, within=20)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 20)


async def test_a_registering_worker_wakes_the_leader(pool: Pool, database_dsn: str) -> None:
    # A scan so long that only the notification can explain a prompt dispatch.
    coord = coordinator(pool, database_dsn, scan_interval_s=60.0)
    stop = asyncio.Event()
    loop = asyncio.create_task(coord.run(stop))
    try:
        await poll_until(lambda: _leader_backend(pool))
        await start_run(pool, spec("waiting", 1))

        async def passed_once() -> bool:
            return bool(coord.metrics.registry.get_sample_value("awp_coordinator_passes_total"))

        await poll_until(passed_once)
        assert await pool.fetchval("SELECT count(*) FROM dispatches") == 0
        await register(pool)

        async def dispatched() -> bool:
            count: int = await pool.fetchval("SELECT count(*) FROM dispatches")
            return count == 1

        await poll_until(dispatched, within=20)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 20)


# --- the real binary -------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    env.update(extra)
    return env


def _binary() -> list[str]:
    """The installed awp-coordinator script; the module when the venv lacks it."""
    script = Path(sys.executable).parent / "awp-coordinator"
    return [str(script)] if script.exists() else [sys.executable, "-m", "awp_coordinator"]


class Process:
    def __init__(self, name: str, args: list[str], log_dir: Path, **env: str) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._file = self.log.open("wb")
        self.popen = subprocess.Popen(
            [*_binary(), *args],
            env=_env(**env),
            stdout=self._file,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def lines(self) -> list[dict[str, object]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(30)
        self._file.close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.close()
    for process in started:
        sys.stderr.write(f"--- {process.name} ---\n{process.log.read_text(errors='replace')}\n")


def _pid_of(application_name: str) -> int:
    # "awp-coordinator-lock <pid>@<host>"
    return int(application_name.split(" ", 1)[1].split("@", 1)[0])


@pytest.mark.fault
async def test_kill_9_of_the_leader_hands_over_to_the_standby_within_two_intervals(
    pool: Pool, database_dsn: str, processes: list[Process], tmp_path: Path
) -> None:
    scan = 1.0
    args = ["--database-url", database_dsn, "--scan-interval", str(scan), "--metrics-listen"]
    # Metrics on free ports: whichever survives serves them.
    processes.append(Process("a", [*args, "127.0.0.1:0"], tmp_path))
    processes.append(Process("b", [*args, "127.0.0.1:0"], tmp_path))
    by_pid = {p.pid: p for p in processes}

    async def both_contending() -> bool:
        count: int = await pool.fetchval(
            """SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database()
                  AND application_name LIKE 'awp-coordinator-lock %'"""
        )
        return count == 2

    await poll_until(both_contending, within=60)
    backend = await poll_until(lambda: _leader_backend(pool), within=60)
    leader = by_pid[_pid_of(backend.application_name)]
    standby = next(p for p in processes if p is not leader)
    assert any(line.get("msg") == "leadership acquired" for line in leader.lines())

    leader.popen.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()

    async def standby_leads() -> bool:
        now = await _leader_backend(pool)
        return now is not None and _pid_of(now.application_name) == standby.pid

    # Bounded generously for a loaded machine; the requirement itself is asserted below.
    await poll_until(standby_leads, within=30, interval=0.01)
    took = time.monotonic() - killed_at
    assert took <= 2 * scan, f"takeover took {took:.2f} s"
    assert leader.popen.wait(10) == -signal.SIGKILL

    # The new leader acts: a worker and a run appear, the run's task is dispatched.
    await register(pool)
    await start_run(pool, spec("after-failover", 1))

    async def dispatched() -> bool:
        count: int = await pool.fetchval("SELECT count(*) FROM dispatches")
        return count == 1

    await poll_until(dispatched, within=30)
    assert any(line.get("msg") == "leadership acquired" for line in standby.lines())
    (address,) = [
        line["address"] for line in standby.lines() if line.get("msg") == "metrics listening"
    ]
    body = await asyncio.to_thread(_get, f"http://{address}/metrics")
    assert "awp_coordinator_passes_total" in body
    assert "awp_coordinator_leader 1.0" in body

    # SIGTERM: a clean stop that gives the lock back and exits 0.
    standby.popen.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(standby.popen.wait, 30) == 0
    assert await _leader_backend(pool) is None
    messages = [line.get("msg") for line in standby.lines()]
    assert "leadership released" in messages
    assert messages[-1] == "awp-coordinator stopped"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def test_a_missing_database_url_is_a_clear_error() -> None:
    result = subprocess.run(
        [*_binary(), "--metrics-listen", "off"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "--database-url (or AWP_DATABASE_URL) is required" in result.stderr
