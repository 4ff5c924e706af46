"""Real AWP processes for fault tests: awp-server, awp-coordinator and awp-worker as OS
processes against a real PostgreSQL (DESIGN.md §10).

Each is a process.Process: its own session, its own log, killed however the test ends.
Their command lines and timings are in commandlines.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
import commandlines
import grpc
from commandlines import Timings
from figures import FIGURES
from grpc_health.v1 import health_pb2, health_pb2_grpc
from process import Process

from awp.v1 import control_pb2_grpc, worker_pb2_grpc
from awp_common.processes import clean_env, free_port
from awp_db import leadership
from awp_db.embedded import EmbeddedPostgres
from kit import poll_until
from kit.invariants import Expect, RunCost, ScenarioHealth, check_invariants
from kit.invariants.health import deadlocks

T = TypeVar("T")

# Re-exported: the scenarios import them from here.
WORKER_TOKEN = commandlines.WORKER_TOKEN
ADMIN_AUTH = (("authorization", f"Bearer {commandlines.ADMIN_TOKEN}"),)

# Errors that only mean "PostgreSQL is not reachable right now": a probe that meets
# one during an outage scenario has simply not seen its condition yet.
DB_DOWN_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.PostgresConnectionError,
    TimeoutError,
)


async def wait_for(
    probe: Callable[[], Awaitable[T | None]], what: str, *, within: float = 20.0
) -> T:
    """kit.poll_until with room for a process restart, counting an unreachable
    PostgreSQL as "not yet" (a probe may meet one during an outage scenario)."""
    return await poll_until(probe, what, within=within, interval=0.02, tolerate=DB_DOWN_ERRORS)


# --- the cluster ------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    process: Process
    # Every worker session this process registered, oldest first (restarts add more).
    worker_ids: list[str] = field(default_factory=list)

    @property
    def worker_id(self) -> str:
        return self.worker_ids[-1]


class Cluster:
    """The processes of one test, against one database; see module docstring."""

    def __init__(
        self,
        tmp_path: Path,
        dsn: str,
        *,
        timings: Timings | None = None,
        postgres: EmbeddedPostgres | None = None,
    ) -> None:
        self.dir = tmp_path
        self.label = ""  # the test's name (set by its fixture), for the figures it reports
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
        # AWP_* variables of the developer's shell must not leak into the processes.
        self.env = clean_env()

    @property
    def server_address(self) -> str:
        return f"127.0.0.1:{self.server_port}"

    def process(self, name: str) -> Process:
        return self.processes[name]

    def add(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Process:
        existing = self.processes.get(name)
        if existing is not None:
            if existing.alive:
                raise RuntimeError(f"{name} is already running")
            existing.argv = list(argv)
            return existing
        process = Process(name, argv, self.dir / f"{name}.log", env or self.env)
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

    async def check_invariants(
        self, expected: Mapping[UUID, Expect], *, report_each: bool = True
    ) -> dict[UUID, RunCost]:
        """The invariant check, with no deadlock and no INTERNAL answer so far among them;
        each run's cost joins the figures unless the scenario (of many runs) reports their
        totals itself."""
        pool = await self.pool()
        health = ScenarioHealth(
            await deadlocks(pool),
            {name: p.output(current_only=False) for name, p in self.processes.items()},
        )
        costs = await check_invariants(pool, expected, health=health)
        self.invariants_checked = True
        if report_each:
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

    async def start_server(
        self,
        name: str = "server",
        *,
        within: float = 20.0,
        port: int = 0,
        database_url: str = "",
        extra: Sequence[str] = (),
    ) -> Process:
        """Starts (or restarts, on the same port) the server; returns once it serves."""
        self._starters[name] = lambda: self.start_server(name, within=within, port=port,
                                                         database_url=database_url,
                                                         extra=extra)  # fmt: skip
        argv = commandlines.server(
            self.timings,
            database_url=database_url or self.dsn,
            listen=f"127.0.0.1:{port or self.server_port}",
            extra=extra,
        )
        process = self.add(name, argv)
        process.spawn()
        await self.wait_server_ready(process, within=within)
        return process

    async def wait_server_ready(self, process: Process, *, within: float = 20.0) -> None:
        address = process.argv[process.argv.index("--listen") + 1]  # replicas have their own
        line = f"awp-server listening on {address}"

        async def listening() -> bool:
            if not process.alive:
                raise AssertionError(f"{process.name} exited early:\n{process.tail()}")
            return line in process.output()

        await wait_for(listening, f"{process.name} to print {line!r}", within=within)
        # Listening is not serving: health turns SERVING once PostgreSQL answers.
        async with grpc.aio.insecure_channel(address) as channel:
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
        self,
        name: str = "coordinator",
        *,
        expect_leader: bool = True,
        within: float = 20.0,
        database_url: str = "",
        extra: Sequence[str] = (),
    ) -> Process:
        """Starts a coordinator (named `name` in the leader lease) with the extra flags;
        with expect_leader, returns once it leads."""
        self._starters[name] = lambda: self.start_coordinator(
            name,
            expect_leader=expect_leader,
            within=within,
            database_url=database_url,
            extra=extra,
        )
        argv = commandlines.coordinator(
            self.timings, database_url=database_url or self.dsn, instance=name, extra=extra
        )
        process = self.add(name, argv)
        process.spawn()
        if expect_leader:
            await wait_for(
                lambda: self._leads(process),
                f"{name} to hold the leader lease",
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
        """The OS pid of the coordinator holding the live leader lease, if any."""
        lease = await leadership.current(await self.pool())
        process = None if lease is None else self.processes.get(lease.holder)
        return process.pid if process is not None and process.alive else None

    async def _leads(self, process: Process) -> bool:
        if not process.alive:
            raise AssertionError(f"{process.name} exited early:\n{process.tail()}")
        return await self.leader_pid() == process.pid

    # --- awp-worker -------------------------------------------------------------------

    async def start_worker(
        self,
        name: str,
        *,
        concurrency: int = 4,
        server: str | None = None,
        shutdown_grace: float | None = None,
        within: float = 20.0,
        wait_registered: bool = True,
        extra: Sequence[str] = (),
    ) -> WorkerProcess:
        """Starts (or restarts) a worker; returns once its new session is active.
        extra: more flags (e.g. --label, --resource)."""
        self._starters[name] = lambda: self.start_worker(
            name,
            concurrency=concurrency,
            server=server,
            shutdown_grace=shutdown_grace,
            within=within,
            wait_registered=wait_registered,
            extra=extra,
        )
        argv = commandlines.worker(
            self.timings,
            server=server or self.server_address,
            name=name,
            concurrency=concurrency,
            shutdown_grace=shutdown_grace,
        ) + list(extra)
        process = self.add(name, argv)
        return await self._spawn_worker(process, wait_registered, within)

    async def start_foreign_worker(
        self, name: str, argv: Sequence[str], *, within: float = 20.0
    ) -> WorkerProcess:
        """Any worker program (another language); it must register under `name`."""
        self._starters[name] = lambda: self.start_foreign_worker(name, argv, within=within)
        return await self._spawn_worker(self.add(name, argv), True, within)

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
