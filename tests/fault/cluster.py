"""Real AWP processes for fault tests: awp-server, awp-coordinator and awp-worker as OS
processes against a real PostgreSQL (DESIGN.md §10).

Each process runs in its own session (so its process group can be signalled as a whole
and a terminal's Ctrl-C does not reach it), writes stdout and stderr to its own log
file, and is killed however the test ends: by the fixture's finalizer, and by an
atexit hook when pytest itself is interrupted.

Timings are short but keep production's proportions: the lease (2 s) stays well above
the worker's safety margin (0.5 s) and eight heartbeat intervals (0.25 s), so a healthy
worker never loses a lease to scheduling noise on a busy two-core machine.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeVar
from uuid import UUID

import asyncpg
import grpc
from figures import FIGURES
from grpc_health.v1 import health_pb2, health_pb2_grpc
from invariants import Expect, RunCost, check_invariants

from awp.v1 import control_pb2_grpc, worker_pb2_grpc
from awp_db.coordination import LEADER_LOCK_KEY
from awp_db.embedded import EmbeddedPostgres, free_port

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
# The console scripts of this venv: exactly what an operator would run.
BIN_DIR = Path(sys.executable).parent
WORKER_TOKEN = "fault-worker-token"
ADMIN_TOKEN = "fault-admin-token"
ADMIN_AUTH = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
WORKER_AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)

# Errors that only mean "PostgreSQL is not reachable right now": a probe that meets
# one during an outage scenario has simply not seen its condition yet.
DB_DOWN_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.PostgresConnectionError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True)
class Timings:
    lease_ttl_s: float = 2.0
    heartbeat_s: float = 0.25
    stream_grace_s: float = 0.75
    scan_s: float = 0.25
    safety_margin_s: float = 0.5
    # A floor above 3 heartbeat intervals (0.75 s): a server restart silences every worker for
    # the restart itself (0.3-0.9 s here) plus its channel's reconnect backoff (capped at 1 s,
    # +20% jitter) -- up to ~2.5 s -- and a healthy session must survive that. Production
    # proportions (5 s heartbeat, 15 s offline) have the slack; compressed timings need it
    # spelled out. Leases still expire after 2 s, a killed worker's after the 0.75 s grace.
    offline_after_s: float = 4.0
    # A worker's claim long poll; short so a restarted server is not kept waiting on it.
    claim_wait_s: float = 2.0
    shutdown_timeout_s: float = 15.0


# --- processes --------------------------------------------------------------------------

# Every process group still alive, for the atexit safety net (pytest interrupted by
# Ctrl-C may skip fixture finalizers; orphaned servers would keep ports and databases).
_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@atexit.register
def _kill_leftovers() -> None:
    for pgid, popen in list(_LIVE.items()):
        _kill_group(pgid)
        with contextlib.suppress(Exception):
            popen.wait(timeout=5)
    _LIVE.clear()


def _stamp() -> str:
    return datetime.now().strftime("%H:%M:%S.%f")[:-3]


class Process:
    """One OS process of the cluster; can be started again after it ended."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log: IO[bytes] | None = None
        # Offset of this incarnation's output in the log file (restarts append).
        self.log_offset = 0

    def __repr__(self) -> str:
        return f"Process({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def spawn(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._reap()
        self.starts += 1
        self._log = self.log_path.open("ab")
        self.log_offset = self._log.tell()
        banner = f"=== {_stamp()} {self.name} start #{self.starts}: {' '.join(self.argv)}\n"
        self._log.write(banner.encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=REPO,
            start_new_session=True,
        )
        _LIVE[self.popen.pid] = self.popen

    def signal(self, sig: signal.Signals) -> None:
        """Sends sig to the whole process group (a wrapper's children too)."""
        if self.popen is None or self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} is not running")
        self._note(f"signal {sig.name}")
        os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """kill -9 the process group and reap it: a crash, no cleanup of any kind."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self._note("signal SIGKILL")
        _kill_group(self.popen.pid)
        self.popen.wait(timeout=10)
        self._reap()

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    async def wait_exit(self, within: float) -> int:
        """The exit code, once the process has ended; fails after `within` seconds."""
        popen = self.popen
        if popen is None:
            raise RuntimeError(f"{self.name} was never started")
        deadline = time.monotonic() + within
        while (code := popen.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not exit within {within} s")
            await asyncio.sleep(0.02)
        self._reap()
        return code

    async def stop(self, within: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it is still alive after `within` seconds."""
        if not self.alive:
            self._reap()
            return self.returncode
        self.terminate()
        try:
            return await self.wait_exit(within)
        except AssertionError:
            self.kill()
            return self.returncode

    def output(self, *, current_only: bool = True) -> str:
        """The log text (of this incarnation only, unless told otherwise)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        if current_only:
            data = data[self.log_offset :]
        return data.decode(errors="replace")

    def json_lines(self, *, current_only: bool = True) -> list[dict[str, Any]]:
        """The structured (--log-format json) lines of the log; other lines skipped."""
        found = []
        for line in self.output(current_only=current_only).splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
        return found

    def count_logged(self, text: str) -> int:
        """How many structured lines of this incarnation have text in their message."""
        return sum(text in str(line.get("msg", "")) for line in self.json_lines())

    async def logged(self, text: str) -> bool:
        """A wait_for probe: has this incarnation logged a message containing text?"""
        return self.count_logged(text) > 0

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output(current_only=False).splitlines()[-lines:])

    def _note(self, text: str) -> None:
        with contextlib.suppress(OSError), self.log_path.open("ab") as log:
            log.write(f"=== {_stamp()} {self.name}: {text}\n".encode())

    def _reap(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            _LIVE.pop(self.popen.pid, None)
            if self._log is not None:
                self._log.close()
                self._log = None


# --- polling ----------------------------------------------------------------------------


async def wait_for(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    *,
    within: float = 20.0,
    interval: float = 0.02,
    tolerate: tuple[type[BaseException], ...] = DB_DOWN_ERRORS,
) -> T:
    """Polls probe until it returns something truthy; fails after `within` seconds.

    Errors of the `tolerate` kinds count as "not yet" (e.g. PostgreSQL restarting).
    """
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            value = await probe()
        except tolerate as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


async def stays(
    probe: Callable[[], Awaitable[bool]], what: str, *, observe_for: float, interval: float = 0.05
) -> None:
    """Asserts probe stays true for a whole observation window.

    Only for proving that something does *not* happen (e.g. no worker, no progress);
    never as a stand-in for waiting on something that should happen.
    """
    deadline = time.monotonic() + observe_for
    while time.monotonic() < deadline:
        if not await probe():
            raise AssertionError(f"{what} stopped holding within {observe_for} s")
        await asyncio.sleep(interval)


# --- the cluster ------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    process: Process
    # Every worker session this process registered, oldest first (restarts add more).
    worker_ids: list[str] = field(default_factory=list)

    @property
    def worker_id(self) -> str:
        return self.worker_ids[-1]


@dataclass(frozen=True, slots=True)
class HeldLease:
    """What holder.py reveals: enough to replay its calls after it died."""

    worker_id: str
    session_token: str
    dispatch_id: int
    lease_token: str
    fencing_token: int
    run_id: str
    task_key: str


class Cluster:
    """The processes of one test, against one database; see module docstring."""

    def __init__(
        self,
        tmp_path: Path,
        dsn: str,
        *,
        timings: Timings | None = None,
        postgres: EmbeddedPostgres | None = None,
        label: str = "",
    ) -> None:
        self.dir = tmp_path
        self.label = label  # the test's name, for the figures it reports
        self.dsn = dsn
        self.timings = timings or Timings()
        # Set only when this test owns its PostgreSQL (outage scenarios).
        self.postgres = postgres
        self.server_port = free_port()
        self.processes: dict[str, Process] = {}
        self.workers: dict[str, WorkerProcess] = {}
        self._pool: asyncpg.Pool | None = None
        # Every scenario must end with the invariant check (DESIGN.md §10); the fixture
        # fails a test that passed without it.
        self.invariants_checked = False
        # How to start each named process again, readiness wait included (restart()).
        self._starters: dict[str, Callable[[], Awaitable[object]]] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._env = dict(os.environ)
        self._env["PYTHONUNBUFFERED"] = "1"
        # AWP_* variables of the developer's shell must not leak into the processes.
        for key in [k for k in self._env if k.startswith("AWP_")]:
            del self._env[key]

    @property
    def server_address(self) -> str:
        return f"127.0.0.1:{self.server_port}"

    def process(self, name: str) -> Process:
        return self.processes[name]

    def _add(self, name: str, argv: Sequence[str]) -> Process:
        existing = self.processes.get(name)
        if existing is not None:
            if existing.alive:
                raise RuntimeError(f"{name} is already running")
            existing.argv = list(argv)
            return existing
        process = Process(name, argv, self.dir / f"{name}.log", self._env)
        self.processes[name] = process
        return process

    # --- database ---------------------------------------------------------------------

    async def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=0, max_size=4, command_timeout=10
            )
        return self._pool

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        pool = await self.pool()
        rows: list[asyncpg.Record] = await pool.fetch(query, *args)
        return rows

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        pool = await self.pool()
        row: asyncpg.Record | None = await pool.fetchrow(query, *args)
        return row

    async def fetchval(self, query: str, *args: Any) -> Any:
        pool = await self.pool()
        return await pool.fetchval(query, *args)

    async def check_invariants(self, expected: Mapping[UUID, Expect]) -> dict[UUID, RunCost]:
        costs = await check_invariants(await self.pool(), expected)
        self.invariants_checked = True
        for cost in costs.values():
            FIGURES.append(f"{cost.line()} [{self.label}]")  # printed by the checker too
        return costs

    async def db_now(self) -> datetime:
        """PostgreSQL's clock: every recovery figure is measured on it, like the leases."""
        now: datetime = await self.fetchval("SELECT clock_timestamp()")
        return now

    # --- gRPC clients -----------------------------------------------------------------

    def channel(self, address: str | None = None) -> grpc.aio.Channel:
        """A channel closed with the cluster. Call from inside the running loop."""
        channel = grpc.aio.insecure_channel(
            address or self.server_address,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 500),
            ],
        )
        self._channels.append(channel)
        return channel

    def control(self) -> control_pb2_grpc.ControlServiceAsyncStub:
        return control_pb2_grpc.ControlServiceStub(self.channel())

    def worker_stub(self) -> worker_pb2_grpc.WorkerServiceAsyncStub:
        return worker_pb2_grpc.WorkerServiceStub(self.channel())

    # --- awp-server -------------------------------------------------------------------

    async def start_server(self, name: str = "server", *, within: float = 20.0) -> Process:
        """Starts (or restarts, on the same port) the server; returns once it serves."""
        self._starters[name] = lambda: self.start_server(name, within=within)
        t = self.timings
        process = self._add(
            name,
            [
                str(BIN_DIR / "awp-server"),
                "--database-url",
                self.dsn,
                "--listen",
                self.server_address,
                "--metrics-listen",
                "off",
                "--worker-token",
                WORKER_TOKEN,
                "--admin-token",
                ADMIN_TOKEN,
                "--lease-ttl",
                str(t.lease_ttl_s),
                "--heartbeat-interval",
                str(t.heartbeat_s),
                "--stream-grace",
                str(t.stream_grace_s),
                "--log-format",
                "json",
            ],
        )
        process.spawn()
        await self.wait_server_ready(process, within=within)
        return process

    async def wait_server_ready(self, process: Process, *, within: float = 20.0) -> None:
        line = f"awp-server listening on {self.server_address}"

        async def listening() -> bool:
            if not process.alive:
                raise AssertionError(f"{process.name} exited early:\n{process.tail()}")
            return line in process.output()

        await wait_for(listening, f"{process.name} to print {line!r}", within=within)
        # Listening is not serving: health turns SERVING once PostgreSQL answers.
        async with grpc.aio.insecure_channel(self.server_address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def serving() -> bool:
                try:
                    response = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                except grpc.aio.AioRpcError:
                    return False
                return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

            await wait_for(serving, f"{process.name} health SERVING", within=within)

    # --- awp-coordinator --------------------------------------------------------------

    async def start_coordinator(
        self, name: str = "coordinator", *, expect_leader: bool = True, within: float = 20.0
    ) -> Process:
        """Starts a coordinator; with expect_leader, returns once it holds the leader lock."""
        self._starters[name] = lambda: self.start_coordinator(
            name, expect_leader=expect_leader, within=within
        )
        t = self.timings
        process = self._add(
            name,
            [
                str(BIN_DIR / "awp-coordinator"),
                "--database-url",
                self.dsn,
                "--scan-interval",
                str(t.scan_s),
                "--offline-after",
                str(t.offline_after_s),
                "--metrics-listen",
                "off",
                "--log-format",
                "json",
            ],
        )
        process.spawn()
        if expect_leader:
            await wait_for(
                lambda: self._leads(process),
                f"{name} to hold the leader lock",
                within=within,
            )
        else:
            await wait_for(
                lambda: self._says(process, "standing by"),
                f"{name} to stand by",
                within=within,
            )
        return process

    async def _says(self, process: Process, message: str) -> bool:
        if not process.alive:
            raise AssertionError(f"{process.name} exited early:\n{process.tail()}")
        return await process.logged(message)

    async def leader_pid(self) -> int | None:
        """The OS pid of the coordinator holding the leader lock, if any."""
        row = await self.fetch(
            """
            SELECT a.application_name, a.client_port
              FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted
               AND l.classid = ($1::bigint >> 32)::oid
               AND l.objid = ($1::bigint & 4294967295)::oid
               AND l.objsubid = 1
            """,
            LEADER_LOCK_KEY,
        )
        if not row:
            return None
        return await self._owner_of_port(row[0]["client_port"])

    async def _leads(self, process: Process) -> bool:
        if not process.alive:
            raise AssertionError(f"{process.name} exited early:\n{process.tail()}")
        return await self.leader_pid() == process.pid

    async def _owner_of_port(self, port: int) -> int | None:
        """Which of our processes owns the local end of a PostgreSQL connection.

        The application_name need not name the process; the TCP port always does (all
        processes run on this machine, over loopback).
        """
        owners = await asyncio.to_thread(_socket_owners, {p.pid for p in self.live()})
        return owners.get(port)

    # --- awp-worker -------------------------------------------------------------------

    async def start_worker(
        self,
        name: str,
        *,
        concurrency: int = 4,
        server: str | None = None,
        shutdown_timeout: float | None = None,
        within: float = 20.0,
        wait_registered: bool = True,
    ) -> WorkerProcess:
        """Starts (or restarts) a worker; returns once its new session is active."""
        self._starters[name] = lambda: self.start_worker(
            name,
            concurrency=concurrency,
            server=server,
            shutdown_timeout=shutdown_timeout,
            within=within,
            wait_registered=wait_registered,
        )
        t = self.timings
        process = self._add(
            name,
            [
                str(BIN_DIR / "awp-worker"),
                "--server",
                server or self.server_address,
                "--token",
                WORKER_TOKEN,
                "--name",
                name,
                "--kinds",
                "mock",
                "--concurrency",
                str(concurrency),
                "--shutdown-timeout",
                str(shutdown_timeout if shutdown_timeout is not None else t.shutdown_timeout_s),
                "--safety-margin",
                str(t.safety_margin_s),
                "--claim-wait",
                str(t.claim_wait_s),
                "--metrics-port",
                "0",
                "--log-format",
                "json",
            ],
        )
        return await self._spawn_worker(process, wait_registered, within)

    async def start_foreign_worker(
        self, name: str, argv: Sequence[str], *, within: float = 20.0
    ) -> WorkerProcess:
        """Any worker program (another language); it must register under `name`."""
        self._starters[name] = lambda: self.start_foreign_worker(name, argv, within=within)
        return await self._spawn_worker(self._add(name, argv), True, within)

    async def _spawn_worker(
        self, process: Process, wait_registered: bool, within: float
    ) -> WorkerProcess:
        handle = self.workers.setdefault(process.name, WorkerProcess(process))
        process.spawn()
        if wait_registered:
            await self.wait_registered(handle, within=within)
        return handle

    async def wait_registered(self, handle: WorkerProcess, *, within: float = 20.0) -> str:
        known = set(handle.worker_ids)
        process = handle.process

        async def registered() -> str | None:
            if not process.alive:
                raise AssertionError(f"{process.name} exited early:\n{process.tail()}")
            rows = await self.fetch(
                "SELECT id::text FROM workers WHERE name = $1 AND state = 'active'"
                " ORDER BY registered_at",
                process.name,
            )
            fresh = [row["id"] for row in rows if row["id"] not in known]
            return fresh[-1] if fresh else None

        worker_id = await wait_for(registered, f"{process.name} to register", within=within)
        handle.worker_ids.append(worker_id)
        return worker_id

    async def start_holder(self, name: str, *, within: float = 20.0) -> tuple[Process, HeldLease]:
        """Starts holder.py (a worker that tells its secrets); returns once it holds a lease."""
        process = self._add(
            name,
            [sys.executable, str(Path(__file__).with_name("holder.py")), self.server_address,
             WORKER_TOKEN, name],
        )  # fmt: skip
        process.spawn()

        async def holding() -> dict[str, Any] | None:
            if not process.alive:
                raise AssertionError(f"{name} exited early:\n{process.tail()}")
            return next((line for line in process.json_lines() if line.get("holding")), None)

        line = await wait_for(holding, f"{name} to hold a lease", within=within)
        return process, HeldLease(**{k: v for k, v in line.items() if k != "holding"})

    def worker_of(self, worker_id: str) -> WorkerProcess:
        for handle in self.workers.values():
            if worker_id in handle.worker_ids:
                return handle
        raise KeyError(f"no worker process registered session {worker_id}")

    async def restart(self, name: str, *, graceful: bool = True, within: float = 30.0) -> None:
        """Stops a process (SIGTERM and wait, or kill -9) and starts it again, same flags,
        returning once it is ready again (a restarted worker registers a new session)."""
        process = self.processes[name]
        if graceful:
            await process.stop(within)
        else:
            process.kill()
        await self._starters[name]()

    # --- the whole ----------------------------------------------------------------------

    def live(self) -> Iterator[Process]:
        return (p for p in self.processes.values() if p.alive)

    def log_tails(self, lines: int = 60) -> list[tuple[str, str]]:
        tails = [(p.name, p.tail(lines)) for p in self.processes.values()]
        if self.postgres is not None:
            with contextlib.suppress(OSError):
                text = self.postgres.log_file.read_text(errors="replace")
                tails.append(("postgres", "\n".join(text.splitlines()[-lines:])))
        return tails

    async def snapshot(self) -> str:
        """The database's view for a failure report: runs, tasks, live leases, workers."""
        queries = {
            "runs": "SELECT id, state, revision, last_seq, cancel_requested_at FROM runs",
            "tasks by state": "SELECT run_id, state, count(*) FROM tasks GROUP BY 1, 2"
            " ORDER BY 1, 2",
            "unfinished tasks": "SELECT run_id, key, state, attempts, retry_at FROM tasks"
            " WHERE finished_at IS NULL ORDER BY id LIMIT 30",
            "live dispatches": "SELECT id, task_id, state, worker_id, lease_expires_at,"
            " clock_timestamp() AS now FROM dispatches WHERE state IN ('pending', 'leased')"
            " ORDER BY id LIMIT 30",
            "workers": "SELECT id, name, state, last_heartbeat_at, clock_timestamp() AS now"
            " FROM workers ORDER BY registered_at",
            "attempts by state": "SELECT state, count(*) FROM attempts GROUP BY 1",
        }
        lines = []
        for title, query in queries.items():
            lines.append(f"-- {title}")
            try:
                async with asyncio.timeout(5):
                    rows = await self.fetch(query)
            except Exception as exc:
                lines.append(f"   (unavailable: {exc!r})")
                continue
            lines.extend("   " + ", ".join(f"{k}={v}" for k, v in row.items()) for row in rows)
        return "\n".join(lines)

    async def close(self) -> None:
        """Kills every process group (no grace: the test is over), closes clients."""
        for process in self.processes.values():
            process.kill()
        for channel in self._channels:
            with contextlib.suppress(Exception):
                await channel.close()
        if self._pool is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._pool.close()
            self._pool = None


def _socket_owners(pids: set[int | None]) -> dict[int, int]:
    """{local TCP port: pid} for the sockets of the given processes (Linux /proc)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        if pid is None:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes[target[8:-1]] = pid
    owners: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines, None)
            for line in lines:
                parts = line.split()
                if len(parts) > 9 and parts[9] in inodes:
                    owners[int(parts[1].rsplit(":", 1)[1], 16)] = inodes[parts[9]]
    return owners
