"""One cluster per repetition (a fresh database, awp-server, awp-coordinator and the
workers), and the measurement window over it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from processes import (
    KINDS,
    WORKER_CONCURRENCY,
    PgProcesses,
    Postgres,
    Proc,
    _cpu_ticks,
    scrape,
    spawn,
    wait_for,
)

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_common.processes import free_ports
from awp_db.connect import connect
from awp_db.migrate import migrate

# StartRun calls in flight while starting many runs.
START_CONCURRENCY = 64

# --- one cluster per repetition ----------------------------------------------------------


class Cluster:
    """A fresh database and the processes serving it."""

    def __init__(
        self, pg: Postgres, database: str, logdir: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.pg = pg
        # Extra environment of every process (the tracing scenario's OTEL_* variables).
        self.env = dict(env or {})
        self.database = database
        self.dsn = pg.dsn_for(database)
        self.logdir = logdir
        self.procs: list[Proc] = []
        # Chosen together: two free_port() calls in a row may return the same port.
        self.grpc_port, self.server_metrics, self.coordinator_metrics = free_ports(3)
        self.channel: grpc.aio.Channel | None = None
        self.control: control_pb2_grpc.ControlServiceStub | None = None
        self.db: asyncpg.Connection | None = None  # the script's connection to the bench db
        self.own_queries = 0  # statements the script ran on it (each one transaction)
        self._workers = 0
        self._worker_args: tuple[str, ...] = ()

    async def query(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert self.db is not None
        self.own_queries += 1
        rows: list[asyncpg.Record] = await self.db.fetch(sql, *args)
        return rows

    async def start(self, workers: int, worker_args: tuple[str, ...] = ()) -> None:
        self._worker_args = worker_args
        admin = await connect(self.pg.dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            await admin.execute(f"CREATE DATABASE {self.database}")
        finally:
            await admin.close()
        conn = await connect(self.dsn)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        self.db = await connect(self.dsn, application_name="awp-bench")
        self.procs.append(
            spawn(
                "server",
                "server",
                [
                    "--database-url", self.dsn,
                    "--listen", f"127.0.0.1:{self.grpc_port}",
                    "--metrics-listen", f"127.0.0.1:{self.server_metrics}",
                    "--insecure",
                ],
                self.logdir,
                self.env,
            )
        )  # fmt: skip
        self.procs.append(
            spawn(
                "coordinator",
                "coordinator",
                [
                    "--database-url", self.dsn,
                    "--metrics-listen", f"127.0.0.1:{self.coordinator_metrics}",
                ],
                self.logdir,
                self.env,
            )
        )  # fmt: skip
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        health = health_pb2_grpc.HealthStub(self.channel)

        async def serving() -> bool:
            self._check_alive()
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                return False
            return answer.status == health_pb2.HealthCheckResponse.SERVING

        await wait_for(serving, "awp-server to serve")

        async def leading() -> bool:
            self._check_alive()
            try:
                found = await asyncio.to_thread(scrape, self.coordinator_metrics)
            except OSError:
                return False
            return found.get(("awp_coordinator_leader", ()), 0.0) == 1.0

        await wait_for(leading, "awp-coordinator to lead")
        await self.add_workers(workers)

    async def add_workers(self, count: int) -> list[Proc]:
        added = []
        for _ in range(count):
            self._workers += 1
            added.append(
                spawn(
                    "worker",
                    f"worker-{self._workers}",
                    [
                        "--server", f"127.0.0.1:{self.grpc_port}",
                        "--kinds", "mock",
                        "--concurrency", str(WORKER_CONCURRENCY),
                        "--name", f"bench-worker-{self._workers}",
                        *self._worker_args,
                    ],
                    self.logdir,
                    self.env,
                )
            )  # fmt: skip
        self.procs.extend(added)
        expected = self._workers

        async def registered() -> bool:
            self._check_alive()
            rows = await self.query("SELECT count(*) AS n FROM workers WHERE state = 'active'")
            return int(rows[0]["n"]) >= expected

        await wait_for(registered, f"{expected} workers to register", within=120)
        return added

    async def start_runs(self, wf: types_pb2.WorkflowDefinition, count: int) -> list[UUID]:
        """Creates the workflow and starts `count` runs of it, START_CONCURRENCY StartRun
        calls in flight at most (what a busy API client might do)."""
        control = self.control
        assert control is not None
        await control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
        gate = asyncio.Semaphore(START_CONCURRENCY)

        async def one(i: int) -> UUID:
            async with gate:
                answer = await control.StartRun(
                    runs_pb2.StartRunRequest(
                        workflow_name=wf.name, workflow_version=wf.version, request_id=f"bench-{i}"
                    ),
                    timeout=300,
                )
            return UUID(answer.run.id)

        return list(await asyncio.gather(*(one(i) for i in range(count))))

    async def wait_runs(self, run_ids: list[UUID], within: float = 600.0) -> list[asyncpg.Record]:
        """The runs' rows once none is running; raises unless all succeeded."""

        async def finished() -> list[asyncpg.Record] | None:
            self._check_alive()
            rows = await self.query(
                "SELECT id, state, created_at, finished_at FROM runs WHERE id = ANY($1::uuid[])",
                run_ids,
            )
            return rows if all(row["state"] != "running" for row in rows) else None

        rows = await wait_for(
            finished, f"{len(run_ids)} run(s) to finish", within=within, every=0.05
        )
        bad = [row for row in rows if row["state"] != "succeeded"]
        if bad:
            raise RuntimeError(f"runs did not succeed: {[(str(r['id']), r['state']) for r in bad]}")
        return rows

    def _check_alive(self) -> None:
        for proc in self.procs:
            code = proc.popen.poll()
            if code is not None and code != -signal.SIGKILL:
                tail = proc.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{proc.name} exited with {code}; log tail:\n{tail}")

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.kind == "worker"]

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        # Workers first (they drain), then the coordinator, then the server.
        for kinds in (("worker",), ("coordinator", "server")):
            group = [p for p in self.procs if p.kind in kinds and p.popen.poll() is None]
            for proc in group:
                proc.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for proc in group:
                try:
                    proc.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()
        if self.db is not None:
            await self.db.close()
        admin = await connect(self.pg.dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        finally:
            await admin.close()


# --- measurement window ------------------------------------------------------------------


class Window:
    """Counters between start() and stop(): xacts, empty claims, CPU, peak RSS."""

    def __init__(self, cluster: Cluster, pg: PgProcesses, admin: asyncpg.Connection) -> None:
        self.cluster = cluster
        self.pg = pg
        self.admin = admin  # on the maintenance database: its reads do not count
        self._sampler: asyncio.Task[None] | None = None
        self.figures: dict[str, Any] = {}

    async def _xacts(self) -> int:
        value: int = await self.admin.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.cluster.database
        )
        return value

    async def _settled_xacts(self) -> int:
        # Backends publish their counters at most once a second while idle.
        await asyncio.sleep(1.2)
        return await self._xacts()

    def _sample(self) -> None:
        for proc in self.cluster.procs:
            proc.sample()
        self.pg.sample()

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            await asyncio.to_thread(self._sample)

    async def start(self) -> None:
        self.xacts0 = await self._settled_xacts()
        self.own0 = self.cluster.own_queries
        self.claims0 = await asyncio.to_thread(scrape, self.cluster.server_metrics)
        self.coord0 = await asyncio.to_thread(scrape, self.cluster.coordinator_metrics)
        self._sample()
        self.cpu0 = {p.pid: p.cpu for p in self.cluster.procs}
        self.pg_cpu0 = dict(self.pg.cpu)
        self.load0 = os.getloadavg()
        self.ticks0 = _cpu_ticks()
        self._sampler = asyncio.create_task(self._sample_forever())

    async def stop(self, tasks: int) -> dict[str, Any]:
        self._sample()
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        load1 = os.getloadavg()
        steal1, total1 = _cpu_ticks()
        steal0, total0 = self.ticks0
        claims1 = await asyncio.to_thread(scrape, self.cluster.server_metrics)
        coord1 = await asyncio.to_thread(scrape, self.cluster.coordinator_metrics)
        xacts1 = await self._settled_xacts()
        own = self.cluster.own_queries - self.own0

        def delta(
            before: dict[Any, float], after: dict[Any, float], name: str, **labels: str
        ) -> float:
            key = (name, tuple(sorted(labels.items())))
            return after.get(key, 0.0) - before.get(key, 0.0)

        cpu: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        rss: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        for proc in self.cluster.procs:
            cpu[proc.kind] += proc.cpu - self.cpu0.get(proc.pid, 0.0)
            rss[proc.kind] = max(rss[proc.kind], proc.peak_rss / 2**20)
        cpu["postgres"] = sum(c - self.pg_cpu0.get(pid, 0.0) for pid, c in self.pg.cpu.items())
        empty = delta(self.claims0, claims1, "awp_claims_total", outcome="empty")
        leased = delta(self.claims0, claims1, "awp_claims_total", outcome="leased")
        passes = delta(self.coord0, coord1, "awp_coordinator_passes_total")
        return {
            "empty_claims_per_task": empty / tasks,
            "claims_per_task": (empty + leased) / tasks,
            "db_xacts_per_task": (xacts1 - self.xacts0 - own) / tasks,
            "coordinator_passes_per_task": passes / tasks,
            "cpu_s_per_task": {kind: value / tasks for kind, value in cpu.items()},
            "peak_rss_mb": rss,
            "loadavg_before": list(self.load0),
            "loadavg_after": list(load1),
            # Share of the machine's CPU time the hypervisor gave to others meanwhile.
            "cpu_steal": (steal1 - steal0) / max(1, total1 - total0),
        }
